//! What tools (and a thinking model) change about a chat request: the prompt, how the
//! output is parsed, and the grammar it is generated under.
//!
//! With `required` or a named function the whole output is generated under the JSON
//! Schema of the call(s). With `auto` the model writes freely until the format's trigger
//! appears; from there the call is constrained the same way (the engine's trigger
//! segments, with an optional trigger). Several calls are the format's structural tags
//! repeated. A model that thinks first gets these constraints after `</think>`, and
//! `response_format` too. With `auto`, `response_format` shapes the answer when there is no
//! call; with `required` or a named function it is ignored, as OpenAI does.
//!
//! The grammar is one [`GrammarSource`] (`AfterTrigger`, `Tags`, `Either` around the
//! sources), compiled and cached by the engine's grammar cache.

use std::collections::HashSet;

use ferrolm_constraint::json_schema::JsonSchemaOptions;
use ferrolm_constraint::{GrammarSource, TagSequence};

use super::definitions::{all_strict, callable_tools, schema_parts, ChoiceMode, FunctionTool, ToolChoice};
use super::formats::ToolCallFormat;
use super::output::ChatOutputParser;
use super::reasoning::ReasoningFormat;
use crate::errors::{ApiError, ApiResult};
use crate::structured::Structured;

/// The constraint a plan puts on the output, and the request fields its errors name.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedConstraint {
    /// The structured part (the calls' schema, or the request's own constraint).
    pub body: Structured,
    /// The functions' parameters by field: the one named when `body` does not compile.
    pub parts: Vec<(String, String)>,
    pub tags: Option<TagSequence>,
    /// An answer in the request's format that may come instead of the calls.
    pub answer: Option<Structured>,
    /// Free text until each, in the order the output meets them.
    pub triggers: Vec<String>,
    /// The output may end before the last trigger.
    pub optional: bool,
}

impl PlannedConstraint {
    fn plain(body: Structured) -> Self {
        PlannedConstraint {
            body,
            parts: Vec::new(),
            tags: None,
            answer: None,
            triggers: Vec::new(),
            optional: false,
        }
    }

    /// The calls between their tags (without the answer or the triggers).
    pub fn tagged(&self) -> GrammarSource {
        match &self.tags {
            Some(tags) => {
                GrammarSource::Tags { body: Box::new(self.body.source.clone()), tags: tags.clone() }
            }
            None => self.body.source.clone(),
        }
    }

    /// The answer or the calls (without the triggers).
    pub fn alternatives(&self) -> GrammarSource {
        match &self.answer {
            Some(a) => {
                GrammarSource::Either { first: Box::new(a.source.clone()), second: Box::new(self.tagged()) }
            }
            None => self.tagged(),
        }
    }

    /// The whole grammar: innermost first, the last trigger leads to the structure, each
    /// earlier one to the next.
    pub fn source(&self) -> GrammarSource {
        let mut g = self.alternatives();
        for (k, trigger) in self.triggers.iter().rev().enumerate() {
            g = GrammarSource::AfterTrigger {
                trigger: trigger.clone(),
                then: Box::new(g),
                optional: self.optional && k == 0,
            };
        }
        g
    }
}

#[derive(Debug, Clone)]
pub struct ChatPlan {
    /// The rendered prompt, with what the plan adds.
    pub prompt: String,
    /// The parser for calls; `None`: no calls to parse.
    pub tool_format: Option<ToolCallFormat>,
    pub reasoning: Option<ReasoningFormat>,
    /// The prompt ends with the format's opening: the output is the call.
    pub primed: bool,
    pub parallel: bool,
    pub constraint: Option<PlannedConstraint>,
    /// `Some(false)` where the markers to parse are special tokens.
    pub skip_special_tokens: Option<bool>,
}

impl ChatPlan {
    /// Whether outputs are parsed (else they are plain text).
    pub fn parses(&self) -> bool {
        self.tool_format.is_some() || self.reasoning.is_some()
    }

    pub fn output_parser(&self) -> ChatOutputParser {
        ChatOutputParser::new(
            self.tool_format,
            self.primed,
            self.parallel,
            self.reasoning.as_ref(),
            &self.prompt,
        )
    }
}

#[derive(Clone)]
pub struct PlanInput<'a> {
    pub tools: &'a [FunctionTool],
    pub choice: &'a ToolChoice,
    pub parallel: bool,
    pub tool_format: Option<ToolCallFormat>,
    pub reasoning: Option<&'a ReasoningFormat>,
    pub constrain: bool,
    /// The request's own constraint (`response_format` and the like).
    pub structured: Option<Structured>,
    pub special_tokens: &'a HashSet<String>,
}

fn schema_source(schema: &serde_json::Value, strict: bool) -> GrammarSource {
    let options = JsonSchemaOptions { strict, ..JsonSchemaOptions::default() };
    GrammarSource::JsonSchema(serde_json::to_string(schema).expect("JSON"), options)
}

/// The plan of one request; a 400 naming the request field at fault.
pub fn plan_chat(prompt: String, p: PlanInput<'_>) -> ApiResult<ChatPlan> {
    let mut structured = p.structured;
    let thinking_end = p.reasoning.filter(|r| r.thinking_expected(&prompt)).map(|r| r.end.to_string());
    let reasoning_tags_special =
        p.reasoning.is_some_and(|r| p.special_tokens.contains(r.start) || p.special_tokens.contains(r.end));
    let mut plan = ChatPlan {
        prompt,
        tool_format: None,
        reasoning: p.reasoning.cloned(),
        primed: false,
        parallel: p.parallel,
        constraint: None,
        skip_special_tokens: reasoning_tags_special.then_some(false),
    };
    if p.tools.is_empty() || p.choice.mode == ChoiceMode::None {
        plan.constraint = structured.map(|s| {
            let mut c = PlannedConstraint::plain(s);
            // a special-token </think> is a trigger too: the engine takes the token itself
            c.triggers.extend(thinking_end);
            c
        });
        return Ok(plan);
    }
    let Some(format) = p.tool_format else {
        return Err(ApiError::bad_request(
            "tools: the model's chat template shows no tool-call format known here; name one with \
             --tool-call-parser (Engine.chat: tool_call_parser): hermes, llama3_json or mistral",
            "tools",
        ));
    };
    if p.choice.calls_forced() {
        // as OpenAI: response_format shapes the message's content, and a forced call has none
        structured = None;
    }
    plan.tool_format = Some(format);
    let allowed = callable_tools(p.tools, p.choice);
    let calls =
        |tags: Option<TagSequence>, triggers: Vec<String>, optional: bool, answer: Option<Structured>| {
            PlannedConstraint {
                body: Structured {
                    source: schema_source(&format.body_schema(&allowed, p.parallel), all_strict(&allowed)),
                    field: "tools".into(),
                },
                parts: schema_parts(&allowed),
                tags,
                answer,
                triggers,
                optional,
            }
        };
    if let Some(answer) = structured {
        // `auto` with response_format: an answer in the format, or the calls, each from its
        // first character on
        let field = answer.field.clone();
        let trigger_special = format.trigger().is_some_and(|t| p.special_tokens.contains(t));
        let Some(tags) = format.answer_or_calls_tags(p.parallel).filter(|_| !trigger_special) else {
            return Err(ApiError::bad_request(
                format!(
                    "{field}: with tools and tool_choice auto, {} calls cannot be told apart from an answer in \
                     this format; use tool_choice none or required",
                    format.name()
                ),
                field,
            ));
        };
        if !p.constrain {
            return Err(ApiError::bad_request(
                format!(
                    "{field}: with tools and tool_choice auto it needs the tool-call constraint, which this \
                     server turns off"
                ),
                field,
            ));
        }
        plan.constraint = Some(calls(Some(tags), thinking_end.into_iter().collect(), false, Some(answer)));
        return Ok(plan);
    }
    let trigger = format.trigger();
    if trigger.is_some_and(|t| p.special_tokens.contains(t)) {
        // the engine lets free text write it (as the token), and the parser must see it
        plan.skip_special_tokens = Some(false);
    }
    let (written, triggers, optional) = if p.choice.calls_forced() && thinking_end.is_none() {
        // the output starts inside the call (even unconstrained: the model is told to call)
        plan.prompt.push_str(format.opening());
        plan.primed = true;
        (format.opening(), Vec::new(), false)
    } else if let Some(t) = trigger {
        let triggers: Vec<String> = thinking_end.into_iter().chain([t.to_string()]).collect();
        (t, triggers, p.choice.mode == ChoiceMode::Auto)
    } else {
        return Ok(plan); // parsed only
    };
    if !p.constrain {
        return Ok(plan);
    }
    let tags = match format.tags() {
        Some(tags) if p.parallel && p.choice.function.is_none() => {
            let begun = if tags.begin.starts_with(written) { written.to_string() } else { String::new() };
            Some(TagSequence { begun, ..tags })
        }
        _ => None,
    };
    plan.constraint = Some(calls(tags, triggers, optional, None));
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::definitions::parse_tools;
    use crate::tools::reasoning::DEEPSEEK_R1;
    use serde_json::json;

    fn tools() -> Vec<FunctionTool> {
        parse_tools(Some(&json!([{"type": "function", "function": {"name": "ping"}},
                                 {"type": "function", "function": {"name": "move", "parameters": {"type": "object"}}}])))
        .unwrap()
    }

    fn input<'a>(
        tools: &'a [FunctionTool],
        choice: &'a ToolChoice,
        special: &'a HashSet<String>,
    ) -> PlanInput<'a> {
        PlanInput {
            tools,
            choice,
            parallel: true,
            tool_format: Some(ToolCallFormat::Hermes),
            reasoning: None,
            constrain: true,
            structured: None,
            special_tokens: special,
        }
    }

    #[test]
    fn forced_calls_prime_the_prompt_and_auto_waits_for_the_trigger() {
        let (t, special) = (tools(), HashSet::new());
        let required = ToolChoice { mode: ChoiceMode::Required, function: None };
        let plan = plan_chat("P".into(), input(&t, &required, &special)).unwrap();
        assert_eq!(plan.prompt, "P<tool_call>\n");
        assert!(plan.primed);
        let c = plan.constraint.unwrap();
        assert_eq!(c.tags.as_ref().unwrap().begun, "<tool_call>\n");
        assert!(c.triggers.is_empty());
        assert_eq!(c.parts.len(), 2);
        let auto = ToolChoice { mode: ChoiceMode::Auto, function: None };
        let plan = plan_chat("P".into(), input(&t, &auto, &special)).unwrap();
        let c = plan.constraint.unwrap();
        assert_eq!((c.triggers.as_slice(), c.optional), (&["<tool_call>".to_string()][..], true));
        assert_eq!(c.tags.unwrap().begun, "<tool_call>");
        let named = ToolChoice { mode: ChoiceMode::Required, function: Some("move".into()) };
        let c = plan_chat("P".into(), input(&t, &named, &special)).unwrap().constraint.unwrap();
        assert!(c.tags.is_none());
        assert_eq!(
            c.parts,
            vec![("tools.1.function.parameters".to_string(), "{\"type\":\"object\"}".to_string())]
        );
    }

    #[test]
    fn thinking_comes_first_and_an_answer_may_come_instead_of_calls() {
        let (t, special) = (tools(), HashSet::new());
        let required = ToolChoice { mode: ChoiceMode::Required, function: None };
        let mut i = input(&t, &required, &special);
        i.reasoning = Some(&DEEPSEEK_R1);
        let plan = plan_chat("P".into(), i).unwrap();
        assert!(!plan.primed);
        assert_eq!(plan.constraint.unwrap().triggers, ["</think>", "<tool_call>"]);
        let auto = ToolChoice { mode: ChoiceMode::Auto, function: None };
        let mut i = input(&t, &auto, &special);
        i.structured = Some(Structured { source: GrammarSource::Regex("a".into()), field: "regex".into() });
        let c = plan_chat("P".into(), i).unwrap().constraint.unwrap();
        assert_eq!(c.answer.unwrap().field, "regex");
        let mut i = input(&t, &auto, &special);
        i.tool_format = Some(ToolCallFormat::Llama3Json);
        i.structured =
            Some(Structured { source: GrammarSource::Regex("a".into()), field: "response_format".into() });
        assert_eq!(plan_chat("P".into(), i).unwrap_err().param.as_deref(), Some("response_format"));
        let mut i = input(&t, &auto, &special);
        i.tool_format = None;
        assert_eq!(plan_chat("P".into(), i).unwrap_err().param.as_deref(), Some("tools"));
    }
}
