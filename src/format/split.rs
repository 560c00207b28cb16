//! Finds the compacted array's elements without reading them with serde.
//!
//! A format reads each element of its array with serde anyway (the fields
//! of a message), and reading the whole body with serde first, only to
//! learn where the elements lie, read every byte of them twice: two thirds
//! of parsing a body. [`top_array`] finds the elements with a scan that
//! only looks for quotes, backslashes and brackets (strings, which are
//! most of the bytes, are skipped with `memchr`), and serde still judges
//! every byte:
//! - the elements, when the format reads each of them;
//! - the rest of the body, read with the array replaced by `[]`
//!   ([`split_body`]), where serde must find the array exactly where
//!   the scan did.
//!
//! The scan trusts nothing it cannot check that way: when anything fails,
//! a format parses the body the plain way (the whole body with serde, then
//! each element), so what a body gives never depends on which way it went.
//! Elements that each read as one complete JSON value, separated by commas,
//! can only be the array's true elements: a cut inside a string or an
//! object would leave a piece that does not read.

use std::ops::Range;

use serde_json::value::RawValue;

/// The top-level array of a body as the scan found it.
pub(crate) struct TopArray<'a> {
    /// The array's bytes in the body, brackets included.
    pub span: Range<usize>,
    /// Each element's text, without the whitespace around it.
    pub elements: Vec<&'a str>,
}

impl TopArray<'_> {
    /// The body with the array replaced by `[]`, for serde to read the
    /// fields outside it, and where that `[]` starts.
    fn outside(&self, body: &str) -> (String, usize) {
        let mut rest = String::with_capacity(body.len() - self.span.len() + 2);
        rest.push_str(&body[..self.span.start]);
        rest.push_str("[]");
        rest.push_str(&body[self.span.end..]);
        (rest, self.span.start)
    }
}

/// The top-level array `field` of `body` as [`top_array`] finds it, and
/// what `read` takes from the rest of the body: `read` gets the body with
/// the array replaced by `[]`, reads it with serde, and returns the array
/// it found there with its own result. `None` unless serde found the array
/// exactly where the scan cut (the cut is then serde's, and everything
/// outside the array is valid JSON) and `read` gave a result.
#[cfg(test)]
pub(crate) fn split_body<'a, R>(
    body: &'a str,
    field: &str,
    read: impl for<'o> FnOnce(&'o str) -> Option<(&'o RawValue, R)>,
) -> Option<(TopArray<'a>, R)> {
    split_body_from(body, field, None, read)
}

/// [`split_body`], resumed: with `from = Some((start, at))` the array is
/// known to open at `start` and its elements up to byte `at` (the end of
/// one) were read already, so only those after `at` are returned (the
/// span is still the whole array's).
pub(crate) fn split_body_from<'a, R>(
    body: &'a str,
    field: &str,
    from: Option<(usize, usize)>,
    read: impl for<'o> FnOnce(&'o str) -> Option<(&'o RawValue, R)>,
) -> Option<(TopArray<'a>, R)> {
    let array = match from {
        None => top_array(body, field)?,
        Some((start, at)) => array_rest(body, start, at)?,
    };
    let (outside, at) = array.outside(body);
    let (found, taken) = read(&outside)?;
    let found = found.get();
    let confirmed = found == "[]" && found.as_ptr() as usize - outside.as_ptr() as usize == at;
    confirmed.then_some((array, taken))
}

/// The elements of the array that is the value of the top-level `field`
/// of `body`, found by a scan; `None` when the body is not an object whose
/// first `field` key (as written, unescaped) has an array value.
pub(crate) fn top_array<'a>(body: &'a str, field: &str) -> Option<TopArray<'a>> {
    array_at(body, top_field_value(body.as_bytes(), field)?)
}

/// Where the value of the first top-level `field` (as written, unescaped)
/// of the object `bytes` starts; `None` when there is none.
fn top_field_value(bytes: &[u8], field: &str) -> Option<usize> {
    let mut at = skip_whitespace(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    loop {
        at = skip_whitespace(bytes, at);
        let key_start = at;
        at = skip_string(bytes, at)?;
        let key = &bytes[key_start + 1..at - 1];
        at = skip_whitespace(bytes, at);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_whitespace(bytes, at + 1);
        if key == field.as_bytes() {
            return Some(at);
        }
        at = skip_value(bytes, at)?;
        at = skip_whitespace(bytes, at);
        match bytes.get(at) {
            Some(b',') => at += 1,
            _ => return None,
        }
    }
}

/// The array that starts at `at`, split into its elements.
fn array_at(body: &str, start: usize) -> Option<TopArray<'_>> {
    let bytes = body.as_bytes();
    if bytes.get(start) != Some(&b'[') {
        return None;
    }
    let mut elements = Vec::new();
    let mut at = skip_whitespace(bytes, start + 1);
    if bytes.get(at) == Some(&b']') {
        return Some(TopArray {
            span: start..at + 1,
            elements,
        });
    }
    loop {
        let element_start = at;
        at = skip_value(bytes, at)?;
        // Cut on char boundaries: every cut is next to an ASCII byte.
        elements.push(body.get(element_start..at)?);
        at = skip_whitespace(bytes, at);
        match bytes.get(at) {
            Some(b',') => at = skip_whitespace(bytes, at + 1),
            Some(b']') => {
                return Some(TopArray {
                    span: start..at + 1,
                    elements,
                })
            }
            _ => return None,
        }
    }
}

/// The elements after byte `at` of the array opening at `start`, `at`
/// being the end of one of its elements: what follows must be `]` or `,`
/// and more elements.
fn array_rest(body: &str, start: usize, at: usize) -> Option<TopArray<'_>> {
    let bytes = body.as_bytes();
    if bytes.get(start) != Some(&b'[') || at <= start + 1 {
        return None;
    }
    let mut elements = Vec::new();
    let mut at = skip_whitespace(bytes, at);
    loop {
        match bytes.get(at) {
            Some(b',') => at = skip_whitespace(bytes, at + 1),
            Some(b']') => {
                return Some(TopArray {
                    span: start..at + 1,
                    elements,
                })
            }
            _ => return None,
        }
        let element_start = at;
        at = skip_value(bytes, at)?;
        elements.push(body.get(element_start..at)?);
        at = skip_whitespace(bytes, at);
    }
}

/// Where the first `N` elements of the array that is the value of the
/// top-level `field` of `body` end (fewer when it holds fewer, none when
/// it is empty or not found): what the prefix cache files a body under.
pub(crate) fn leading_elements<const N: usize>(bytes: &[u8], field: &str) -> Vec<usize> {
    leading(bytes, field, N).unwrap_or_default()
}

fn leading(bytes: &[u8], field: &str, n: usize) -> Option<Vec<usize>> {
    let start = top_field_value(bytes, field)?;
    if bytes.get(start) != Some(&b'[') {
        return None;
    }
    let mut end = start + 1;
    let mut ends = Vec::with_capacity(n);
    for _ in 0..n {
        let next = skip_whitespace(bytes, end);
        let next = match bytes.get(next) {
            Some(b',') if !ends.is_empty() => skip_whitespace(bytes, next + 1),
            Some(b']') => break,
            _ if ends.is_empty() => next,
            _ => break,
        };
        match skip_value(bytes, next) {
            Some(at) => end = at,
            None => break,
        }
        ends.push(end);
    }
    Some(ends)
}

fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Past the string that starts at `at` (its opening quote).
fn skip_string(bytes: &[u8], at: usize) -> Option<usize> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let mut at = at + 1;
    loop {
        at += memchr::memchr2(b'"', b'\\', bytes.get(at..)?)?;
        if bytes[at] == b'"' {
            return Some(at + 1);
        }
        // A backslash escapes the next byte (`\"`, `\\`; in `\u1234` the
        // next byte is the `u`).
        at += 2;
    }
}

/// Past the value that starts at `at`: strings are skipped whole, objects
/// and arrays by counting brackets outside strings, anything else (a
/// number, `true`, `false`, `null`) up to the next delimiter.
fn skip_value(bytes: &[u8], at: usize) -> Option<usize> {
    match *bytes.get(at)? {
        b'"' => skip_string(bytes, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut at = at;
            loop {
                match *bytes.get(at)? {
                    b'"' => {
                        at = skip_string(bytes, at)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(at + 1);
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
        }
        _ => {
            let rest = &bytes[at..];
            let len = rest
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(rest.len());
            (len > 0).then_some(at + len)
        }
    }
}

/// What the formats' tests of the split way share.
#[cfg(test)]
pub(crate) mod testing {
    use proptest::prelude::*;

    use crate::format::{Parsed, Skip};

    /// A proptest, in a format's tests, that its split way gives exactly
    /// what its plain way gives whenever it gives anything, on well-formed
    /// bodies (the `$top` fields around an array `$field` of `$pieces`) and
    /// on bodies cut or spliced at random; and that well-formed bodies go
    /// the split way. Calls the format's `parse_split` and `parse_plain`.
    macro_rules! split_agreement {
        ($field:expr, $pieces:expr, $top:expr) => {
            proptest::proptest! {
                #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

                #[test]
                fn the_split_way_agrees_with_the_plain_way(
                    before in proptest::collection::vec(0usize..100, 0..3),
                    items in proptest::collection::vec(0usize..100, 0..8),
                    after in proptest::collection::vec(0usize..100, 0..3),
                    cut in proptest::option::of((0usize..1000, 0usize..6, 0usize..100)),
                    max in 3usize..10,
                ) {
                    let (body, should_split) = $crate::format::split::testing::body(
                        $field, &$pieces, &$top, &before, &items, &after, cut,
                    );
                    let (split, plain) = (parse_split(&body, max), parse_plain(&body, max));
                    $crate::format::split::testing::agree(split, plain, should_split)?;
                }
            }
        };
    }
    pub(crate) use split_agreement;

    /// A body of the `top` fields picked by `before` and `after` around an
    /// array `field` of the `pieces` picked by `messages`, then, with
    /// `cut`, a few bytes at a random place replaced by a piece of syntax;
    /// and whether it should go the split way if it reads at all: when
    /// nothing was cut and no other top field is `field`.
    pub fn body(
        field: &str,
        pieces: &[&str],
        top: &[&str],
        before: &[usize],
        messages: &[usize],
        after: &[usize],
        cut: Option<(usize, usize, usize)>,
    ) -> (String, bool) {
        let fields =
            |picks: &[usize]| -> Vec<&str> { picks.iter().map(|&i| top[i % top.len()]).collect() };
        let messages: Vec<&str> = messages.iter().map(|&i| pieces[i % pieces.len()]).collect();
        let mut fields_around = fields(before);
        let repeated = fields(before)
            .iter()
            .chain(&fields(after))
            .any(|f| f.starts_with(&format!("\"{field}\"")));
        let array = format!(" \"{field}\" :[{}] ", messages.join(" ,"));
        fields_around.push(&array);
        fields_around.extend(fields(after));
        let mut body = format!("{{{}}}", fields_around.join(","));
        if let Some((at, len, piece)) = cut {
            let at = at % (body.len() + 1);
            let end = (at + len).min(body.len());
            if body.is_char_boundary(at) && body.is_char_boundary(end) {
                let insert = ["", "]", "\"", ",", "}", "\\", "[", "{"][piece % 8];
                body.replace_range(at..end, insert);
            }
        }
        (body, cut.is_none() && !repeated)
    }

    /// The split way gives exactly what the plain way gives whenever it
    /// gives anything, and a body that should go the split way
    /// ([`body`]) and reads does.
    pub fn agree(
        split: Option<Parsed>,
        plain: Result<Parsed, Skip>,
        should_split: bool,
    ) -> Result<(), TestCaseError> {
        match split {
            Some(split) => {
                let plain = plain.expect("the plain way reads what the split way read");
                prop_assert_eq!(format!("{split:?}"), format!("{plain:?}"));
            }
            None => prop_assert!(!(should_split && plain.is_ok()), "not split"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct ArrayOnly<'a> {
        #[serde(borrow)]
        messages: &'a RawValue,
    }

    fn split(body: &str) -> Option<(&str, Vec<&str>)> {
        top_array(body, "messages").map(|a| (&body[a.span.clone()], a.elements))
    }

    #[test]
    fn finds_the_elements_of_the_top_level_array() {
        let body = r#" { "model" : "m", "tools": [{"a": "]\"}"}], "n": -1.5e3, "ok": true,
            "messages" : [ {"role":"user","content":"a, b ] }"} ,{"x":[1,{"y":"\\"}]}, 7, "s" ] , "z": null } "#;
        let (array, elements) = split(body).unwrap();
        assert!(array.starts_with("[ {\"role\"") && array.ends_with("\"s\" ]"));
        assert_eq!(
            elements,
            [
                r#"{"role":"user","content":"a, b ] }"}"#,
                r#"{"x":[1,{"y":"\\"}]}"#,
                "7",
                r#""s""#
            ]
        );
        assert_eq!(split(r#"{"messages":[]}"#).unwrap(), ("[]", vec![]));
        assert_eq!(split(r#"{"messages":[ ]}"#).unwrap(), ("[ ]", vec![]));
    }

    #[test]
    fn gives_up_on_what_it_cannot_split() {
        for body in [
            r#"["messages"]"#,
            r#"{"messages": {}}"#,
            r#"{"model": "m"}"#,
            r#"{"messages": [1, 2"#,
            r#"{"messages": [1 2]}"#,
            r#"{"messages": ["unterminated]}"#,
            r#"{"a": {"messages": [1]}}"#,
            r#"{"model" "m", "messages": [1]}"#,
            r#"{"messag\u0065s": [1]}"#,
            "",
        ] {
            assert!(split(body).is_none(), "{body}");
        }
    }

    #[test]
    fn serde_confirms_where_the_array_was_cut() {
        #[derive(serde::Deserialize)]
        struct WithModel<'a> {
            #[serde(borrow)]
            model: &'a RawValue,
        }
        let body = r#"{"model":"m","messages":[{"role":"user"}],"stream":true}"#;
        let (array, seen) = split_body(body, "messages", |outside| {
            let top: ArrayOnly = serde_json::from_str(outside).ok()?;
            Some((top.messages, outside.to_owned()))
        })
        .unwrap();
        assert_eq!(seen, r#"{"model":"m","messages":[],"stream":true}"#);
        assert_eq!(&body[array.span], r#"[{"role":"user"}]"#);
        // An array found anywhere else than at the cut is not trusted.
        let elsewhere = split_body(body, "messages", |outside| {
            let top: WithModel = serde_json::from_str(outside).ok()?;
            Some((top.model, ()))
        });
        assert!(elsewhere.is_none());
        // A second `messages` key: serde refuses the duplicate, so the
        // scan's cut is never trusted.
        let twice = r#"{"messages":[{"role":"user"}],"messages":[]}"#;
        let refused = split_body(twice, "messages", |outside| {
            let top: ArrayOnly = serde_json::from_str(outside).ok()?;
            Some((top.messages, ()))
        });
        assert!(refused.is_none());
    }
}
