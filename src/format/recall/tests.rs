use super::*;

#[test]
fn the_tool_is_added_in_each_shape_and_the_clients_wins() {
    let body =
        r#"{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"read"}}]}"#;
    let added = add_tool(Format::Chat, body).unwrap();
    let v: Value = serde_json::from_str(&added).unwrap();
    assert_eq!(v["tools"][1]["function"]["name"], TOOL_NAME);
    assert_eq!(v["tools"][0]["function"]["name"], "read");

    let none = r#"{"model":"m","messages":[]}"#;
    let v: Value = serde_json::from_str(&add_tool(Format::Anthropic, none).unwrap()).unwrap();
    assert_eq!(v["tools"][0]["name"], TOOL_NAME);
    assert!(v["tools"][0]["input_schema"].is_object());
    let v: Value = serde_json::from_str(&add_tool(Format::Responses, none).unwrap()).unwrap();
    assert_eq!(v["tools"][0]["type"], "function");

    let theirs = format!(r#"{{"messages":[],"tools":[{{"name":"{TOOL_NAME}"}}]}}"#);
    assert_eq!(
        add_tool(Format::Anthropic, &theirs),
        Err(NotAdded::ClientTool)
    );
    let forced =
        r#"{"messages":[],"tools":[{"name":"x"}],"tool_choice":{"type":"tool","name":"x"}}"#;
    assert_eq!(
        add_tool(Format::Anthropic, forced),
        Err(NotAdded::ToolChoice)
    );
    let any = r#"{"messages":[],"tools":[{"name":"x"}],"tool_choice":{"type":"any"}}"#;
    assert!(add_tool(Format::Anthropic, any).is_ok());
    let empty = r#"{"messages":[],"tools":[]}"#;
    let v: Value = serde_json::from_str(&add_tool(Format::Chat, empty).unwrap()).unwrap();
    assert_eq!(v["tools"].as_array().unwrap().len(), 1);
}

#[test]
fn a_follow_up_only_appends() {
    let body = r#"{"messages":[{"role":"user","content":"a"}],"stream":true}"#;
    let out = append(Format::Chat, body, &["{\"x\":1}".into()]).unwrap();
    assert_eq!(
        out,
        r#"{"messages":[{"role":"user","content":"a"},{"x":1}],"stream":true}"#
    );
    let input = r#"{"input":"hi"}"#;
    let out = append(Format::Responses, input, &["{\"x\":1}".into()]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["input"][0]["content"], "hi");
    assert_eq!(v["input"][1]["x"], 1);
}

#[test]
fn streams_are_read_into_turns() {
    let chat = "data: {\"choices\":[{\"delta\":{\"content\":\"Hm\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"compaction_recall\",\"arguments\":\"{\\\"ids\\\":\"}}]}}]}\n\n\
        data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"[\\\"rc_t1_0000000000000000\\\"]}\"}}]}}]}\n\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5}}\n\ndata: [DONE]\n\n";
    let turn = read_stream(Format::Chat, chat.as_bytes()).unwrap();
    assert_eq!(turn.calls[0].ids(), vec!["rc_t1_0000000000000000"]);
    assert_eq!(turn.assistant[0]["content"], "Hm");
    assert_eq!(turn.usage.unwrap()["prompt_tokens"], 5);

    let anthropic = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n\
        event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"tu\",\"name\":\"compaction_recall\",\"input\":{}}}\n\n\
        event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"ids\\\":[\\\"a\\\"]}\"}}\n\n\
        event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n";
    let turn = read_stream(Format::Anthropic, anthropic.as_bytes()).unwrap();
    assert_eq!(turn.calls[0].ids(), vec!["a"]);
    assert_eq!(turn.assistant[0]["content"][0]["input"]["ids"][0], "a");
    let usage = turn.usage.unwrap();
    assert_eq!(
        (
            usage["input_tokens"].as_u64(),
            usage["output_tokens"].as_u64()
        ),
        (Some(7), Some(9))
    );
}

#[test]
fn usage_adds_field_by_field() {
    let mut total = json!({"input_tokens": 10, "details": {"cached": 2}, "name": "x"});
    add_usage(
        &mut total,
        &json!({"input_tokens": 5, "details": {"cached": 1}, "output_tokens": 3}),
    );
    assert_eq!(
        total,
        json!({"input_tokens": 15, "details": {"cached": 3}, "name": "x", "output_tokens": 3})
    );
    let body = br#"{"id":"x","usage":{"prompt_tokens":1},"z":2}"#;
    let out = with_usage_json(body, &json!({"prompt_tokens": 4})).unwrap();
    assert_eq!(out, br#"{"id":"x","usage":{"prompt_tokens":5},"z":2}"#);
}
