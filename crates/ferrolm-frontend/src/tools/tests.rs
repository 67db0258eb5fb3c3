//! The parsers on the recorded outputs in each family's documented format
//! (`tests/data/tool_call_outputs.json`): whole, and streamed in pieces of every size.

use serde_json::Value;

use super::call_scanner::{match_header, Header};
use super::formats::{detect_format, held_back, tool_call_format, ToolCallFormat};
use super::output::{ChatOutputParser, MessageBuilder, PieceKind};
use super::reasoning::{detect_reasoning, reasoning_format, DEEPSEEK_R1, QWEN3};

const RECORDED: &str = include_str!("../../../../tests/data/tool_call_outputs.json");

fn cases() -> Vec<Value> {
    let v: Value = serde_json::from_str(RECORDED).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn format_of(case: &Value) -> Option<ToolCallFormat> {
    case["format"].as_str().map(|f| tool_call_format(f, None).unwrap())
}

fn parser_for(case: &Value, parallel: bool) -> ChatOutputParser {
    let reasoning = case.get("reasoning").and_then(Value::as_str).map(|r| reasoning_format(r, None).unwrap());
    let prompt = case.get("prompt").and_then(Value::as_str).unwrap_or("");
    ChatOutputParser::new(format_of(case), false, parallel, reasoning.as_ref(), prompt)
}

fn parse(case: &Value, chunks: &[&str], parallel: bool) -> MessageBuilder {
    let mut parser = parser_for(case, parallel);
    let mut built = MessageBuilder::default();
    for c in chunks {
        built.add(parser.feed(c));
    }
    built.add(parser.finish());
    built
}

type Summary = (String, String, Vec<(String, String)>);

fn summary(b: &MessageBuilder) -> Summary {
    (
        b.reasoning.clone(),
        b.content.clone(),
        b.calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect(),
    )
}

fn or_null(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        Value::from(s)
    }
}

/// Splits at char boundaries into pieces of 1 to `longest` chars (a fixed LCG).
fn split(text: &str, seed: u64, longest: usize) -> Vec<&str> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < bounds.len() {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let k = 1 + ((state >> 33) as usize % longest);
        let j = (i + k).min(bounds.len() - 1);
        out.push(&text[bounds[i]..bounds[j]]);
        i = j;
    }
    out
}

#[test]
fn recorded_outputs_parse_to_the_expected_messages() {
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let built = parse(&case, &[case["output"].as_str().unwrap()], true);
        assert_eq!(or_null(&built.content), case["content"], "{name}");
        let calls: Vec<Value> = built
            .calls
            .iter()
            .map(|c| serde_json::json!([c.name, serde_json::from_str::<Value>(&c.arguments).unwrap()]))
            .collect();
        assert_eq!(Value::Array(calls), case["calls"], "{name}");
        assert_eq!(
            or_null(&built.reasoning),
            case.get("reasoning_content").cloned().unwrap_or(Value::Null),
            "{name}"
        );
        let mut ids: Vec<&str> = built.calls.iter().map(|c| c.id.as_str()).collect();
        assert!(ids.iter().all(|id| id.starts_with("call_") && id.len() == 29), "{name}");
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), built.calls.len(), "{name}");
    }
}

#[test]
fn streamed_in_any_pieces_it_says_the_same() {
    for case in cases() {
        let output = case["output"].as_str().unwrap();
        let whole = summary(&parse(&case, &[output], true));
        let chars: Vec<String> = output.chars().map(String::from).collect();
        let one_by_one: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(summary(&parse(&case, &one_by_one, true)), whole, "{}", case["name"]);
        for seed in 0..25 {
            assert_eq!(summary(&parse(&case, &split(output, seed, 7), true)), whole, "{}", case["name"]);
        }
    }
}

#[test]
fn any_text_streams_as_it_parses_whole() {
    // malformed outputs included: the pieces always put together to the whole parse
    let alphabet: Vec<char> = "{}[]\",:\\ nameargs<>/tool_cl\n".chars().collect();
    let mut state = 7u64;
    for _ in 0..300 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
        let len = (state >> 40) as usize % 60;
        let text: String = (0..len)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                alphabet[(state >> 33) as usize % alphabet.len()]
            })
            .collect();
        for f in ["hermes", "llama3_json", "mistral"] {
            let case = serde_json::json!({"format": f, "reasoning": "qwen3"});
            let whole = summary(&parse(&case, &[&text], true));
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(summary(&parse(&case, &pieces, true)), whole, "{f} {text:?}");
        }
    }
}

#[test]
fn a_call_is_announced_with_its_name_before_its_arguments_stream() {
    let mut parser = ChatOutputParser::new(Some(ToolCallFormat::Hermes), false, true, None, "");
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
    let head = text.find("\"city\"").unwrap();
    let pieces = parser.feed(&text[..head]);
    let got: Vec<(PieceKind, &str)> = pieces.iter().map(|p| (p.kind, p.text.as_str())).collect();
    assert_eq!(got, [(PieceKind::Call, "get_weather"), (PieceKind::Arguments, "{")]);
    let mut rest = parser.feed(&text[head..]);
    rest.extend(parser.finish());
    assert_eq!(rest.iter().map(|p| p.text.as_str()).collect::<String>(), "\"city\": \"Paris\", \"days\": 3}");
    assert!(rest.iter().all(|p| p.kind == PieceKind::Arguments && p.index == 0));
}

#[test]
fn partial_tags_are_held_back_until_they_resolve() {
    let mut parser = ChatOutputParser::new(Some(ToolCallFormat::Hermes), false, true, None, "");
    assert_eq!(parser.feed("a <tool").iter().map(|p| p.text.as_str()).collect::<Vec<_>>(), ["a"]);
    assert_eq!(parser.feed("box> b").iter().map(|p| p.text.as_str()).collect::<Vec<_>>(), [" <toolbox> b"]);
    assert_eq!((held_back("x </thi", "</think>"), held_back("abc", "</think>")), (5, 0));
}

#[test]
fn primed_outputs_start_inside_the_call() {
    for (format, output) in [
        (ToolCallFormat::Hermes, r#"{"name":"f","arguments":{"a":1}}"#),
        (ToolCallFormat::Mistral, r#"[{"name":"f","arguments":{"a":1}},{"name":"g","arguments":{}}]"#),
        (ToolCallFormat::Llama3Json, r#"{"name":"f","parameters":{"a":1}}"#),
    ] {
        let mut parser = ChatOutputParser::new(Some(format), true, true, None, "");
        let mut built = MessageBuilder::default();
        built.add(parser.feed(output));
        built.add(parser.finish());
        assert_eq!(built.calls[0].name, "f", "{format:?}");
        assert_eq!(
            serde_json::from_str::<Value>(&built.calls[0].arguments).unwrap(),
            serde_json::json!({"a": 1})
        );
        assert_eq!(built.content, "");
    }
}

#[test]
fn without_parallel_calls_only_the_first_is_kept() {
    let case = cases().into_iter().find(|c| c["name"] == "hermes-parallel-calls").unwrap();
    let built = parse(&case, &[case["output"].as_str().unwrap()], false);
    assert_eq!(built.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["get_current_temperature"]);
    assert!(built.content.is_empty());
}

#[test]
fn an_unconstrained_call_cut_short_keeps_what_came() {
    let mut parser = ChatOutputParser::new(Some(ToolCallFormat::Hermes), false, true, None, "");
    let mut built = MessageBuilder::default();
    built.add(parser.feed("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": "));
    built.add(parser.finish());
    assert_eq!(summary(&built).2, [("f".to_string(), "{\"a\": ".to_string())]);
}

#[test]
fn the_call_header_is_recognized_as_it_streams() {
    let found = |name: &str, at: usize| Header::Found(name.into(), at);
    let cases = [
        ("{\"name\": \"f\", \"arguments\": {", found("f", 27)),
        (" {\n \"name\" : \"f\\\"g\" ,\t\"arguments\":\n[", found("f\"g", 35)),
        ("{\"name\": \"f\", \"arguments\": ", Header::More),
        ("{\"na", Header::More),
        ("{\"name\": \"f\", \"argu", Header::More),
        ("{\"name\": \"f\", \"parameters\": {", Header::No),
        ("{\"arguments\": {}, \"name\": \"f\"}", Header::No),
        ("[{\"name\"", Header::No),
    ];
    for (raw, want) in cases {
        assert_eq!(match_header(raw, &["arguments"]), want, "{raw:?}");
    }
}

#[test]
fn formats_are_found_by_name_and_from_the_chat_template() {
    assert_eq!(tool_call_format("qwen25", None), Some(ToolCallFormat::Hermes));
    assert_eq!(tool_call_format("llama3", None), Some(ToolCallFormat::Llama3Json));
    assert_eq!(tool_call_format("none", Some("<tool_call>")), None);
    assert_eq!(detect_format(Some("{{ '<tool_call>' }}")), Some(ToolCallFormat::Hermes));
    assert_eq!(detect_format(Some("{{ '[TOOL_CALLS]' }}")), Some(ToolCallFormat::Mistral));
    assert_eq!(detect_format(Some("<|python_tag|>")), Some(ToolCallFormat::Llama3Json));
    assert_eq!(detect_format(Some("{{ '<tool_call>' }}{{ '[TOOL_CALLS]' }}")), None);
    assert_eq!((detect_format(Some("{{ messages }}")), detect_format(None)), (None, None));
    assert_eq!(reasoning_format("deepseek-r1", None), Some(DEEPSEEK_R1));
}

#[test]
fn the_reasoning_format_is_found_from_the_chat_template() {
    let qwen3 =
        "{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}<|im_start|>";
    let deepseek =
        "{% set content = content.split('</think>')[-1] %}{{'<\u{ff5c}Assistant\u{ff5c}>' + content}}";
    assert_eq!(detect_reasoning(Some(qwen3)), Some(QWEN3));
    assert_eq!(detect_reasoning(Some(deepseek)), Some(DEEPSEEK_R1));
    assert_eq!(detect_reasoning(Some("{{ messages }}<tool_call>")), None);
    assert_eq!(reasoning_format("auto", Some(deepseek)), Some(DEEPSEEK_R1));
    assert_eq!(reasoning_format("none", Some(qwen3)), None);
}
