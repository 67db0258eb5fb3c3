//! The request core end to end (render, plan, tokenize, compile) on a small word-level
//! tokenizer and a ChatML template with Hermes tool calls, and the plans of each tool
//! format (what `tests/test_tools_plan.py` checked of the Python port).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ferrolm_constraint::{GrammarCache, GrammarSource, Matcher, Vocabulary};
use serde_json::{json, Value};

use super::*;
use crate::protocol::typed;
use crate::tools::definitions::ChoiceMode;
use crate::tools::reasoning::QWEN3;
use crate::tools::{parse_tool_choice, parse_tools, plan_chat, ToolCallFormat, ToolChoice};

/// ChatML with the tools in the system turn and calls as `<tool_call>` tags (the shape of
/// Qwen 2.5's template, written for this test).
const TEMPLATE: &str = "{{ bos_token }}{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools><|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

const PROMPT: &str = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";

fn tokenizer() -> Tokenizer {
    let words = ["<unk>", "<s>", "<|im_start|>", "<|im_end|>", "<tool_call>", "hi", "user", "assistant"];
    let vocab: serde_json::Map<String, Value> =
        words.iter().enumerate().map(|(i, w)| (w.to_string(), json!(i))).collect();
    let added: Vec<Value> = words[1..5]
        .iter()
        .enumerate()
        .map(|(i, w)| {
            json!({"id": i + 1, "content": w, "single_word": false, "lstrip": false, "rstrip": false,
                              "normalized": false, "special": true})
        })
        .collect();
    let text = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
                      "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
                      "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}});
    Tokenizer::from_json(&text.to_string()).unwrap()
}

fn server_tools() -> ServerTools {
    ServerTools {
        tool_format: Some(ToolCallFormat::Hermes),
        reasoning: None,
        constrain: true,
        special_tokens: ["<tool_call>".to_string()].into_iter().collect(),
    }
}

fn input(request: Value) -> ApiResult<ChatInput> {
    let chat = crate::protocol::parse_offline_chat(&request)?;
    Ok(ChatInput {
        messages: chat.messages,
        tools: chat.tools,
        tool_choice: chat.tool_choice,
        parallel_tool_calls: chat.parallel_tool_calls != Some(false),
        chat_template_kwargs: chat.chat_template_kwargs.unwrap_or_default(),
        structured: None,
        thinking_budget: chat.thinking_token_budget,
    })
}

fn prepare(request: Value) -> ApiResult<PreparedChat> {
    let template = ChatTemplate::new(TEMPLATE, Some("<s>"), Some("<|im_end|>")).unwrap();
    let (tok, tools) = (tokenizer(), server_tools());
    let model = ChatModel { template: Some(&template), tokenizer: &tok, tools: &tools };
    prepare_chat(input(request)?, &model, &|_| Ok(()))
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"], "additionalProperties": false}}})
}

fn ping() -> Value {
    json!({"type": "function", "function": {"name": "ping"}})
}

fn user() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

#[test]
fn a_forced_call_is_rendered_primed_tokenized_and_constrained() {
    let p = prepare(json!({"messages": user(), "tools": [weather(), ping()], "tool_choice": "required"}))
        .unwrap();
    assert!(
        p.prompt().starts_with("<s><|im_start|>system\n<tools>get_weather;ping;</tools>"),
        "{}",
        p.prompt()
    );
    assert!(p.prompt().ends_with("<|im_start|>assistant\n<tool_call>\n"));
    // the template's own BOS and markers, as single tokens: no BOS added in front
    assert_eq!(&p.ids[..3], &[1, 2, 0]);
    assert_eq!(*p.ids.last().unwrap(), 4);
    assert_eq!(p.constraint().unwrap().parts.len(), 2);
    assert_eq!(p.skip_special_tokens(), Some(false), "the parser must see <tool_call>");
    assert!(p.output_parser().is_some());
}

#[test]
fn plain_chat_is_text_without_a_parser_or_constraint() {
    let mut tools = server_tools();
    tools.tool_format = None;
    let template = ChatTemplate::new(TEMPLATE, Some("<s>"), None).unwrap();
    let tok = tokenizer();
    let model = ChatModel { template: Some(&template), tokenizer: &tok, tools: &tools };
    let p = prepare_chat(input(json!({"messages": user()})).unwrap(), &model, &|_| Ok(())).unwrap();
    assert_eq!(p.prompt(), format!("<s>{PROMPT}"));
    assert!(p.constraint().is_none() && p.output_parser().is_none() && p.skip_special_tokens().is_none());
}

#[test]
fn history_calls_reach_the_template_as_mappings() {
    let history = json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"}]);
    let p = prepare(json!({"messages": history, "tools": [ping()], "tool_choice": "none"})).unwrap();
    assert!(p.prompt().contains("<|im_start|>user\nab<|im_end|>"), "{}", p.prompt());
    assert!(p.prompt().contains("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"));
    assert!(p.constraint().is_none());
    let bad = json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]);
    let e = prepare(json!({"messages": bad})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages.0.tool_calls.0.function.arguments"));
}

#[test]
fn bad_requests_name_the_field() {
    let cases = [
        (json!({"messages": user(), "tools": []}), "tools"),
        (json!({"messages": user(), "tools": [{"type": "retrieval"}]}), "tools.0.type"),
        (json!({"messages": user(), "tools": [{"type": "function"}]}), "tools.0.function"),
        (
            json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "has space"}}]}),
            "tools.0.function.name",
        ),
        (
            json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "x".repeat(65)}}]}),
            "tools.0.function.name",
        ),
        (json!({"messages": user(), "tools": [ping(), ping()]}), "tools.1.function.name"),
        (
            json!({"messages": user(), "tools": [weather(), {"type": "function", "function": {"name": "f", "parameters": "object"}}]}),
            "tools.1.function.parameters",
        ),
        (
            json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "f", "description": 3}}]}),
            "tools.0.function.description",
        ),
        (
            json!({"messages": user(), "tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}),
            "tools.0.function.strict",
        ),
        (json!({"messages": user(), "tool_choice": "auto"}), "tool_choice"),
        (json!({"messages": user(), "tools": [ping()], "tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"messages": user(), "tools": [ping()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"messages": user(), "chat_template_kwargs": {"tools": []}}), "chat_template_kwargs"),
    ];
    for (request, field) in cases {
        let e = prepare(request.clone()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(field), "{request}");
        assert!(e.message.starts_with(field), "{}", e.message);
    }
    let offline = |v: Value| crate::protocol::parse_offline_chat(&v).unwrap_err().param;
    assert_eq!(
        offline(json!({"messages": [{"role": "robot", "content": "x"}]})).as_deref(),
        Some("messages.0.role")
    );
    assert_eq!(offline(json!({"messages": []})).as_deref(), Some("messages"));
    assert_eq!(offline(json!({"messages": user(), "temperature": 1})).as_deref(), Some("temperature"));
}

#[test]
fn a_model_without_a_template_names_the_messages() {
    let (tok, tools) = (tokenizer(), server_tools());
    let model = ChatModel { template: None, tokenizer: &tok, tools: &tools };
    let e = prepare_chat(input(json!({"messages": user()})).unwrap(), &model, &|_| Ok(())).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages"));
    assert!(e.message.contains("no chat template"));
}

// ---- plans of each format ----

fn plan(choice: Value, format: ToolCallFormat, special: &[&str]) -> ChatPlan {
    plan_with(choice, format, special, |_| {})
}

fn plan_with(
    choice: Value,
    format: ToolCallFormat,
    special: &[&str],
    edit: impl FnOnce(&mut PlanInput<'_>),
) -> ChatPlan {
    try_plan(choice, format, special, edit).unwrap()
}

fn try_plan(
    choice: Value,
    format: ToolCallFormat,
    special: &[&str],
    edit: impl FnOnce(&mut PlanInput<'_>),
) -> ApiResult<ChatPlan> {
    let tools = parse_tools(Some(&json!([weather(), ping()]))).unwrap();
    let choice = parse_tool_choice(Some(&choice), &tools).unwrap();
    let special: HashSet<String> = special.iter().map(|s| s.to_string()).collect();
    let mut i = PlanInput {
        tools: &tools,
        choice: &choice,
        parallel: true,
        tool_format: Some(format),
        reasoning: None,
        constrain: true,
        structured: None,
        special_tokens: &special,
    };
    edit(&mut i);
    plan_chat(PROMPT.into(), i)
}

fn schema_of(c: &PlannedConstraint) -> Value {
    let GrammarSource::JsonSchema(text, _) = &c.body.source else { panic!("a schema") };
    serde_json::from_str(text).unwrap()
}

fn object() -> Structured {
    Structured { source: GrammarSource::JsonObject(Default::default()), field: "response_format".into() }
}

#[test]
fn special_token_triggers_are_constrained_and_kept_in_the_text() {
    let p = plan(json!("auto"), ToolCallFormat::Mistral, &["[TOOL_CALLS]"]);
    let c = p.constraint.as_ref().unwrap();
    assert_eq!((c.triggers.as_slice(), c.optional), (&["[TOOL_CALLS]".to_string()][..], true));
    assert!(c.tags.is_none() && schema_of(c)["type"] == "array");
    assert_eq!(p.skip_special_tokens, Some(false));
    let forced = plan(json!("required"), ToolCallFormat::Mistral, &["[TOOL_CALLS]"]);
    assert!(forced.primed && forced.prompt.ends_with("[TOOL_CALLS]"));
    let llama = plan(json!("auto"), ToolCallFormat::Llama3Json, &["<|python_tag|>"]);
    let c = llama.constraint.unwrap();
    assert_eq!(c.triggers, ["<|python_tag|>"]);
    let tags = c.tags.unwrap();
    assert_eq!(
        (tags.begin.as_str(), tags.end.as_str(), tags.separator.as_str(), tags.begun.as_str()),
        ("", "", "; ", "")
    );
}

#[test]
fn no_constraint_when_it_is_off_or_the_tools_are_only_shown() {
    let off = plan_with(json!("required"), ToolCallFormat::Hermes, &[], |i| i.constrain = false);
    assert!(off.primed && off.constraint.is_none());
    assert!(plan_with(json!("auto"), ToolCallFormat::Hermes, &[], |i| i.constrain = false)
        .constraint
        .is_none());
    let none = plan(json!("none"), ToolCallFormat::Hermes, &[]);
    assert!(none.constraint.is_none() && none.tool_format.is_none());
    // with tool_choice none the tools are only shown to the model: response_format applies
    let shaped = plan_with(json!("none"), ToolCallFormat::Hermes, &[], |i| i.structured = Some(object()));
    assert_eq!(shaped.constraint.unwrap().source(), object().source);
}

#[test]
fn parallel_calls_are_structural_tags_begun_where_the_prompt_or_trigger_left_off() {
    let begun = |p: ChatPlan| p.constraint.unwrap().tags.map(|t| t.begun);
    assert_eq!(begun(plan(json!("required"), ToolCallFormat::Hermes, &[])).as_deref(), Some("<tool_call>\n"));
    assert_eq!(begun(plan(json!("auto"), ToolCallFormat::Hermes, &[])).as_deref(), Some("<tool_call>"));
    let thinking = plan_with(json!("required"), ToolCallFormat::Hermes, &[], |i| i.reasoning = Some(&QWEN3));
    assert_eq!(begun(thinking).as_deref(), Some("<tool_call>"));
    assert_eq!(begun(plan(json!("required"), ToolCallFormat::Llama3Json, &[])).as_deref(), Some(""));
    // parallel_tool_calls false, or a named function: the one call's JSON
    assert_eq!(
        begun(plan_with(json!("required"), ToolCallFormat::Hermes, &[], |i| i.parallel = false)),
        None
    );
    let named = json!({"type": "function", "function": {"name": "ping"}});
    assert_eq!(begun(plan(named, ToolCallFormat::Hermes, &[])), None);
    let one = plan_with(json!("required"), ToolCallFormat::Mistral, &[], |i| i.parallel = false);
    assert_eq!(schema_of(one.constraint.as_ref().unwrap())["maxItems"], 1);
}

#[test]
fn thinking_closed_in_the_prompt_primes_the_call_again() {
    let tools = parse_tools(Some(&json!([ping()]))).unwrap();
    let choice = parse_tool_choice(Some(&json!("required")), &tools).unwrap();
    let special = HashSet::new();
    let i = PlanInput {
        tools: &tools,
        choice: &choice,
        parallel: true,
        tool_format: Some(ToolCallFormat::Hermes),
        reasoning: Some(&QWEN3),
        constrain: true,
        structured: None,
        special_tokens: &special,
    };
    let p = plan_chat(format!("{PROMPT}<think>\n\n</think>\n\n"), i).unwrap();
    assert!(p.primed);
    let auto = plan_with(json!("auto"), ToolCallFormat::Hermes, &[], |i| i.reasoning = Some(&QWEN3));
    let c = auto.constraint.unwrap();
    assert_eq!(
        (c.triggers.as_slice(), c.optional),
        (&["</think>".to_string(), "<tool_call>".to_string()][..], true)
    );
}

#[test]
fn strict_functions_close_their_objects() {
    let tools =
        parse_tools(Some(&json!([{"type": "function", "function": {"name": "t", "strict": true}}]))).unwrap();
    let choice = ToolChoice { mode: ChoiceMode::Required, function: None };
    let special = HashSet::new();
    let i = PlanInput {
        tools: &tools,
        choice: &choice,
        parallel: true,
        tool_format: Some(ToolCallFormat::Hermes),
        reasoning: None,
        constrain: true,
        structured: None,
        special_tokens: &special,
    };
    let c = plan_chat(PROMPT.into(), i).unwrap().constraint.unwrap();
    let GrammarSource::JsonSchema(_, options) = c.body.source else { panic!("a schema") };
    assert!(options.strict);
    let c = plan(json!("required"), ToolCallFormat::Hermes, &[]).constraint.unwrap();
    let GrammarSource::JsonSchema(_, options) = c.body.source else { panic!("a schema") };
    assert!(!options.strict);
}

#[test]
fn an_answer_in_the_format_or_calls_and_what_cannot_tell_them_apart() {
    let with =
        |choice: Value, format: ToolCallFormat, special: &[&str], edit: &dyn Fn(&mut PlanInput<'_>)| {
            try_plan(choice, format, special, |i| {
                i.structured = Some(object());
                edit(i)
            })
        };
    let p = with(json!("auto"), ToolCallFormat::Hermes, &[], &|_| {}).unwrap();
    let c = p.constraint.unwrap();
    assert_eq!(c.answer.as_ref().unwrap().field, "response_format");
    assert!(c.tags.as_ref().unwrap().repeated && c.triggers.is_empty() && !p.primed);
    let one = with(json!("auto"), ToolCallFormat::Hermes, &[], &|i| i.parallel = false).unwrap();
    assert!(!one.constraint.unwrap().tags.unwrap().repeated);
    let mistral = with(json!("auto"), ToolCallFormat::Mistral, &[], &|_| {}).unwrap();
    let tags = mistral.constraint.unwrap().tags.unwrap();
    assert_eq!((tags.begin.as_str(), tags.repeated), ("[TOOL_CALLS]", false));
    let thinking = with(json!("auto"), ToolCallFormat::Hermes, &[], &|i| i.reasoning = Some(&QWEN3)).unwrap();
    assert_eq!(thinking.constraint.unwrap().triggers, ["</think>"]);
    // a forced call has no content for response_format to shape (as OpenAI): ignored
    let forced = with(json!("required"), ToolCallFormat::Hermes, &[], &|_| {}).unwrap();
    assert!(forced.primed && forced.constraint.unwrap().answer.is_none());
    for (format, special, off) in [
        (ToolCallFormat::Llama3Json, &[][..], false),
        (ToolCallFormat::Mistral, &["[TOOL_CALLS]"][..], false),
        (ToolCallFormat::Hermes, &[][..], true),
    ] {
        let e = with(json!("auto"), format, special, &|i| i.constrain = !off).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format"), "{format:?}");
    }
}

// ---- grammars ----

fn cache() -> GrammarCache {
    let tokens: Vec<Vec<u8>> = (0u8..128).map(|b| vec![b]).chain([b"<tool_call>".to_vec()]).collect();
    let vocab = Vocabulary::new(tokens, &[128], &[0]).unwrap();
    GrammarCache::new(Arc::new(vocab), 64, Duration::from_secs(10))
}

fn accepts(grammar: &Arc<ferrolm_constraint::Grammar>, text: &str) -> bool {
    let mut m = Matcher::new(grammar.clone());
    m.accept_str(text) && m.can_end()
}

#[test]
fn call_grammars_accept_exactly_the_calls() {
    let cache = cache();
    let tree = json!({"type": "function", "function": {"name": "make_tree", "strict": true, "parameters": {
        "$defs": {"node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                           "required": ["children"], "additionalProperties": false}},
        "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"],
        "additionalProperties": false}}});
    let tools = parse_tools(Some(&json!([weather(), tree, ping()]))).unwrap();
    let choice = ToolChoice { mode: ChoiceMode::Required, function: None };
    let special = HashSet::new();
    let i = PlanInput {
        tools: &tools,
        choice: &choice,
        parallel: false,
        tool_format: Some(ToolCallFormat::Hermes),
        reasoning: None,
        constrain: true,
        structured: None,
        special_tokens: &special,
    };
    let c = plan_chat(PROMPT.into(), i).unwrap().constraint.unwrap();
    let (g, _) = compile_planned(&cache, &c).unwrap();
    assert!(accepts(&g, r#"{"name":"get_weather","arguments":{"city":"Oslo"}}"#));
    assert!(accepts(&g, r#"{"name":"make_tree","arguments":{"root":{"children":[{"children":[]}]}}}"#));
    assert!(accepts(&g, r#"{"name":"ping","arguments":{}}"#));
    assert!(!accepts(&g, r#"{"name":"get_weather","arguments":{"unit":"c"}}"#), "city is required");
    assert!(!accepts(&g, r#"{"name":"make_tree","arguments":{"root":{"children":[{}]}}}"#), "the $ref holds");
    assert!(!accepts(&g, r#"{"name":"nope","arguments":{}}"#));
    assert!(!accepts(&g, r#"{"arguments":{},"name":"ping"}"#), "the name is written first");
}

#[test]
fn a_part_that_does_not_compile_is_named_and_so_is_an_answer_that_looks_like_a_call() {
    let cache = cache();
    let bad = json!({"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": "(("}}}}});
    let tools = parse_tools(Some(&json!([weather(), bad]))).unwrap();
    let choice = ToolChoice { mode: ChoiceMode::Required, function: None };
    let special = HashSet::new();
    let mut i = PlanInput {
        tools: &tools,
        choice: &choice,
        parallel: true,
        tool_format: Some(ToolCallFormat::Hermes),
        reasoning: None,
        constrain: true,
        structured: None,
        special_tokens: &special,
    };
    let c = plan_chat(PROMPT.into(), i.clone()).unwrap().constraint.unwrap();
    let e = compile_planned(&cache, &c).unwrap_err();
    assert_eq!((e.status, e.param.as_deref()), (400, Some("tools.1.function.parameters")));
    let tools = parse_tools(Some(&json!([weather()]))).unwrap();
    let auto = ToolChoice { mode: ChoiceMode::Auto, function: None };
    i.tools = &tools;
    i.choice = &auto;
    i.structured =
        Some(Structured { source: GrammarSource::Regex("<[a-z]+>".into()), field: "regex".into() });
    let c = plan_chat(PROMPT.into(), i).unwrap().constraint.unwrap();
    let e = compile_planned(&cache, &c).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("regex"));
    assert!(e.message.contains("cannot be told apart"), "{}", e.message);
}

// ---- the offline API's constraint fields ----

fn fields(v: Value) -> ApiResult<Option<PlannedConstraint>> {
    let f: ConstraintFields = typed(&v, "")?;
    f.planned()
}

#[test]
fn constraint_fields_compose_and_name_the_field_at_fault() {
    let c = fields(json!({"json_object": true, "structured_after": ["</think>", "<tool_call>"],
                          "structured_optional": true, "structured_tags": {"begin": "<a>", "end": "</a>"}}))
    .unwrap()
    .unwrap();
    assert_eq!((c.triggers.len(), c.optional, c.tags.as_ref().unwrap().repeated), (2, true, true));
    assert_eq!(fields(json!({})).unwrap(), None);
    let cases = [
        (json!({"structured_optional": true, "json_object": true}), "structured_optional"),
        (json!({"structured_tags": {"begin": "<a>", "end": "</a>"}}), "structured_tags"),
        (json!({"structured_tags": {"begin": "<a>"}, "json_object": true}), "structured_tags"),
        (
            json!({"structured_tags": {"begin": "<a>", "end": "", "begun": "<b"}, "json_object": true}),
            "structured_tags",
        ),
        (json!({"structured_or": {"json_object": true}}), "structured_or"),
        (json!({"structured_or": {}, "json_object": true}), "structured_or"),
        (json!({"structured_or": {"regex": "a", "choice": ["b"]}, "json_object": true}), "structured_or"),
        (json!({"structured_after": ["</think>", ""], "json_object": true}), "structured_after"),
        (json!({"json_schema_parts": {"a": {}}}), "json_schema_parts"),
        (json!({"regex": "a", "ebnf": "root ::= \"a\""}), "ebnf"),
        (json!({"json_schema_strict": true, "regex": "a"}), "json_schema_strict"),
        (json!({"json_object": true, "whitespace": "wide"}), "whitespace"),
        (json!({"choice": []}), "choice"),
        (json!({"n": 2}), "n"),
    ];
    for (v, field) in cases {
        assert_eq!(fields(v.clone()).unwrap_err().param.as_deref(), Some(field), "{v}");
    }
}

#[test]
fn constraint_fields_compile_with_their_errors_named() {
    let cache = cache();
    let compile = |v: Value| compile_planned(&cache, &fields(v).unwrap().unwrap());
    let (g, _) =
        compile(json!({"regex": "[0-9]+", "structured_after": "<tool_call>", "structured_optional": true}))
            .unwrap();
    assert!(accepts(&g, "free text") && accepts(&g, "x<tool_call>12"));
    let e = compile(json!({"json_schema": {"type": "object", "properties": {"s": {"pattern": "(("}}},
                            "json_schema_parts": {"tools.3.function.parameters": {"pattern": "(("}}}))
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools.3.function.parameters"));
    let e = compile(json!({"json_object": true, "structured_tags": {"begin": "<a>", "end": "</a>"},
                            "structured_or": {"regex": "<b>"}}))
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("structured_or"));
    let e = compile(json!({"ebnf": "root ::= (\"a\""})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("ebnf"));
}

#[test]
fn a_thinking_budget_takes_the_markers_as_tokens_and_where_the_prompt_left_the_thinking() {
    let words = ["<unk>", "<think>", "</think>", "hi"];
    let vocab: serde_json::Map<String, Value> =
        words.iter().enumerate().map(|(i, w)| (w.to_string(), json!(i))).collect();
    let added: Vec<Value> = (1..3)
        .map(|i| {
            json!({"id": i, "content": words[i], "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let text = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
                      "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
                      "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}});
    let tok = Tokenizer::from_json(&text.to_string()).unwrap();
    let with = |reasoning: Option<crate::tools::reasoning::ReasoningFormat>, prompt: &str, budget| {
        let tools = ServerTools { reasoning, ..server_tools() };
        let model = ChatModel { template: None, tokenizer: &tok, tools: &tools };
        thinking_budget(&model, prompt, budget).unwrap()
    };
    let open = ThinkingBudget { budget: 5, start_ids: vec![1], end_ids: vec![2], open: true };
    assert_eq!(with(Some(QWEN3), "hi <think>", Some(5)), Some(open.clone()));
    // the prompt said nothing: Qwen3 thinks once it opens the tag, DeepSeek-R1 at once
    assert_eq!(with(Some(QWEN3), "hi", Some(5)), Some(ThinkingBudget { open: false, ..open.clone() }));
    let r1 = crate::tools::reasoning::DEEPSEEK_R1;
    assert_eq!(with(Some(r1), "hi", Some(5)), Some(open));
    // nothing to cap: the prompt closed the thinking, no reasoning format, no budget
    assert_eq!(with(Some(QWEN3), "hi <think> </think>", Some(5)), None);
    assert_eq!(with(None, "hi <think>", Some(5)), None);
    assert_eq!(with(Some(QWEN3), "hi <think>", None), None);
}
