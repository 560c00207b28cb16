use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::analysis::*;
use super::query::*;
use super::terms::*;
use super::*;

fn stemmed(w: &str) -> String {
    let mut s = w.to_owned();
    stem(&mut s);
    s
}

#[test]
fn stopwords_are_sorted_for_binary_search() {
    assert!(STOPWORDS.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn the_stopword_keys_find_exactly_the_stopwords() {
    let mut words: Vec<String> = vec![
        String::new(),
        "a".into(),
        "abou".into(),
        "abouts".into(),
        "toe".into(),
        "t".into(),
        "yourselves".into(),
        "\u{e5}r".into(),
    ];
    for w in STOPWORDS {
        words.push((*w).into());
        words.push(format!("{w}s"));
        words.push(w[..w.len() - 1].into());
        words.push(w[1..].into());
    }
    for w in &words {
        assert_eq!(
            is_stopword(w),
            STOPWORDS.binary_search(&w.as_str()).is_ok(),
            "{w:?}"
        );
    }
}

/// A scan's terms, each with its kind and key.
type Scanned = Vec<(String, Kind, Option<u128>)>;

/// Each term of `text` with its kind and key, as the generic scan gives
/// them and as [`for_each_keyed_term`] does.
fn both_scans(text: &str) -> (Scanned, Scanned) {
    let mut generic = Vec::new();
    for_each_term(text, |raw, kind| {
        generic.push((raw.to_owned(), kind, packed(raw)))
    });
    let mut keyed = Vec::new();
    let mut masks = TermMasks::default();
    // Twice with the same buffers: what one text leaves must not leak.
    for _ in 0..2 {
        keyed.clear();
        for_each_keyed_term(text, &mut masks, |raw, kind, key| {
            keyed.push((raw.to_owned(), kind, key))
        });
    }
    (generic, keyed)
}

#[test]
fn the_mask_scan_gives_the_generic_scans_terms() {
    let long: String = (0..40).map(|i| format!("w{i}-x{i}.y z_{i} ")).collect();
    for text in [
        "",
        "a",
        "-",
        "The gate code for depot Norrby is 7731-KAPPA.",
        "see src/main.rs:42 and v1.2.3, a--b a-_b -a- x@y.z #1 c++ a+b",
        "v2. Deploy- end-",
        "abcdefghijklmnopqrstuvwxyz0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "exactly-sixty-four-bytes-long-text-to-test-the-block-boundary!!",
        "exactly sixty four bytes long text to test the block boundary ab",
        "sixty-three bytes then a joiner over the block boundary: abcdef-g",
        "Ärger über naïve code", // not ASCII: the generic scan itself
        &long,
    ] {
        let (generic, keyed) = both_scans(text);
        assert_eq!(keyed, generic, "{text:?}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
    /// Random ASCII text, rich in joiners, runs of every length and
    /// block boundaries, scans to the same terms and keys either way.
    #[test]
    fn random_ascii_scans_the_same_either_way(pieces in proptest::collection::vec(
        proptest::prop_oneof![
            proptest::string::string_regex("[a-zA-Z]{1,20}").unwrap(),
            proptest::string::string_regex("[0-9]{1,7}").unwrap(),
            proptest::string::string_regex("[ \t\n]{1,3}").unwrap(),
            proptest::string::string_regex("[-_./:#@+,;!?'()]{1,2}").unwrap(),
        ],
        0..60,
    )) {
        let text = pieces.concat();
        let (generic, keyed) = both_scans(&text);
        proptest::prop_assert_eq!(keyed, generic);

        // Asked about the words of its first half, the query counter
        // counts what the analysis holds.
        let mut query = Query::default();
        for_each_term(&pieces[..pieces.len() / 2].concat(), |t, k| query.add(t, k));
        let analysis = Analysis::of(&text);
        let mut expected = vec![0u32; query.terms.len()];
        query.count_in(&analysis, &mut expected);
        let mut counted = vec![0u32; query.terms.len()];
        let length = QueryCounter::new(&query).count(&text, &mut counted);
        proptest::prop_assert_eq!((length, counted), (analysis.length, expected));
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
    /// What the query counter's prefix filter relies on: a plain word
    /// of ASCII letters and digits normalises to nothing or to a term
    /// that starts with its first two bytes, case-folded.
    #[test]
    fn normalising_keeps_a_words_first_two_bytes(
        word in "[a-zA-Z0-9]{1,6}(ies|ied|sses|ss|us|is|s|ing|ed|ation|ment|ness|y|e|bb|dd|tt|)(s|ed|ing|)"
    ) {
        let folded = word.to_ascii_lowercase();
        if let Some(term) = normalize(&word, Kind::Plain, &mut String::new()) {
            proptest::prop_assert_eq!(&term.as_bytes()[..2], &folded.as_bytes()[..2]);
        }
    }
}

#[test]
fn counting_query_terms_in_text_equals_counting_them_in_analyses() {
    let mut query = Query::default();
    let asked = "Which gate codes open depot-7 at Norrby? src/main.rs tries copies \
                 \u{212a}elvin a-b ab ärger";
    for_each_term(asked, |t, k| query.add(t, k));
    let mut counter = QueryCounter::new(&query);
    for text in [
        "The gate code for depot Norrby is 7731-KAPPA; gates coded.",
        "depot-7 and depot 7 and DEPOT-7, see src/main.rs and main.rs",
        "nothing here",
        "Ärger: the gate at Norrby, naïve codes",
        "",
        "try TRIED tries Copy copied; kelvin KELVIN \u{212a}elvin, A-B a-b AB ab Ab ärger ÄRGER",
        "ab-cd a-bc 1-2 a_b A@B",
    ] {
        let analysis = Analysis::of(text);
        let mut expected = vec![0u32; query.terms.len()];
        query.count_in(&analysis, &mut expected);
        let mut counted = vec![0u32; query.terms.len()];
        assert_eq!(
            counter.count(text, &mut counted),
            analysis.length,
            "{text:?}"
        );
        assert_eq!(counted, expected, "{text:?}");
    }
}

#[test]
fn inflections_share_a_stem() {
    for group in [
        &[
            "deliver",
            "delivers",
            "delivered",
            "delivering",
            "delivery",
            "deliveries",
        ][..],
        &["code", "codes", "coded", "coding"],
        &["plan", "plans", "planned", "planning"],
        &["configure", "configured", "configuration", "configurations"],
        &["copy", "copies", "copied"],
        &["deploy", "deployed", "deployment", "deployments"],
        &["password", "passwords"],
    ] {
        let stems: Vec<String> = group.iter().map(|w| stemmed(w)).collect();
        assert!(
            stems.iter().all(|s| s == &stems[0]),
            "{group:?} -> {stems:?}"
        );
    }
    // Words that merely end like a suffix keep their meaning apart.
    assert_ne!(stemmed("bus"), stemmed("bu"));
    assert_eq!(stemmed("class"), "class");
    assert_eq!(stemmed("this"), "this");
    assert_eq!(stemmed("sing"), "sing");
}

#[test]
fn identifiers_and_numbers_stay_whole_and_give_their_parts() {
    assert_eq!(
        terms("The gate code for depot Norrby is 7731-KAPPA."),
        [
            "gat",
            "cod",
            "depot",
            "norrb",
            "7731-kappa",
            "7731",
            "kappa"
        ]
    );
    assert_eq!(
        terms("see src/main.rs:42"),
        ["see", "src/main.rs:42", "src", "main", "rs", "42"]
    );
    // A joiner must be followed by a letter or digit: sentence ends are not joins.
    assert_eq!(terms("v2. Deploy-"), ["v2", "deploy"]);
}

#[test]
fn an_analysis_counts_every_term_it_normalises() {
    let text = "Kestrel KESTRELS kestrel-7 \u{212a}estrel Ärger ärgerlich naïve Naïve x y \
                src/main.rs main deliveries Delivered 4410 4410-EUR tries try TRY \
                sses SS flies fly ab AB abs the The";
    let analysis = Analysis::of(text);
    let mut expected: Vec<(u64, u32)> = Vec::new();
    for term in terms(text) {
        let id = term_id(&term);
        match expected.iter_mut().find(|(e, _)| *e == id) {
            Some((_, count)) => *count += 1,
            None => expected.push((id, 1)),
        }
    }
    assert_eq!(analysis.terms, expected);
    let mut all = 0;
    for_each_term(text, |_, _| all += 1);
    assert_eq!(analysis.length, all);
    assert!(analysis.terms.iter().any(|&(_, c)| c > 1));
}

/// A cache that counts the analyses it is given.
#[derive(Default)]
struct Recording {
    entries: std::sync::Mutex<FxHashMap<u128, CachedAnalysis>>,
    analysed: std::sync::atomic::AtomicUsize,
}

impl AnalysisCache for Recording {
    fn get(&self, key: u128) -> Option<CachedAnalysis> {
        self.entries.lock().unwrap().get(&key).cloned()
    }
    fn put(&self, key: u128, value: CachedAnalysis) {
        if matches!(value, CachedAnalysis::Message(_)) {
            self.analysed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.entries.lock().unwrap().insert(key, value);
    }
    fn remove(&self, key: u128) {
        self.entries.lock().unwrap().remove(&key);
    }
}

fn history(turns: usize) -> Vec<Message<'static>> {
    (0..turns)
        .map(|i| {
            assistant(&format!(
                "step {i}: deployed build-{} to host {} after fixing the parser",
                i % 5,
                i * 7
            ))
        })
        .chain([user("which host got build-3?")])
        .collect()
}

#[test]
fn a_cache_changes_no_bit_and_a_new_turn_analyses_only_its_messages() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut messages = history(30);
    let cache = Recording::default();
    let cold = analyze_cached(&messages, Some("parser"), &cache);
    assert_eq!(cold, analyze(&messages, Some("parser")));
    assert_eq!(cache.analysed.load(Relaxed), messages.len());

    // The next turn: an answer and a new question.
    messages.push(assistant("host 21 got build-3."));
    messages.push(user("and which step fixed the parser for host 14?"));
    let warm = analyze_cached(&messages, None, &cache);
    assert_eq!(warm, analyze(&messages, None));
    assert_eq!(
        cache.analysed.load(Relaxed),
        messages.len(),
        "only the two new messages are analysed"
    );
    assert_ne!(warm.relevance[..31], cold.relevance[..31]);
    let histories = |cache: &Recording| {
        let entries = cache.entries.lock().unwrap();
        entries
            .values()
            .filter(|e| matches!(e, CachedAnalysis::History(_)))
            .count()
    };
    assert_eq!(histories(&cache), 1, "the earlier turn's history went");

    // A history edited in its middle still finds its unchanged messages.
    messages[3].content.to_mut().push_str(" (rolled back)");
    let edited = analyze_cached(&messages, None, &cache);
    assert_eq!(edited, analyze(&messages, None));
    assert_eq!(cache.analysed.load(Relaxed), messages.len() + 1);
}

#[test]
fn a_long_conversation_chains_then_flattens_its_histories() {
    let cache = Recording::default();
    let mut messages = history(3);
    for turn in 0..(MAX_HISTORY_DEPTH * 2 + 3) {
        messages.push(assistant(&format!("answer {turn}: host {}", turn * 3)));
        messages.push(user(&format!("and host {turn}?")));
        assert_eq!(
            analyze_cached(&messages, None, &cache),
            analyze(&messages, None)
        );
    }
    let keys: Vec<u128> = messages.iter().map(|m| message_key(&m.content)).collect();
    let last = *history_keys(&keys).last().unwrap();
    let Some(CachedAnalysis::History(h)) = cache.get(last) else {
        panic!("the last turn's history is cached");
    };
    assert_eq!(h.len(), messages.len());
    assert!(h.depth <= MAX_HISTORY_DEPTH);
    let mut seen = Vec::new();
    h.for_each(|a| seen.push((**a).clone()));
    let expected: Vec<Analysis> = messages.iter().map(|m| Analysis::of(&m.content)).collect();
    assert_eq!(seen, expected);
    // Each turn analysed only its two new messages.
    assert_eq!(
        cache.analysed.load(std::sync::atomic::Ordering::Relaxed),
        messages.len()
    );
}

#[test]
fn a_colliding_history_entry_is_not_trusted() {
    let messages = history(5);
    let keys: Vec<u128> = messages.iter().map(|m| message_key(&m.content)).collect();
    let cache = Recording::default();
    // A history of the wrong length under the full history's key.
    let wrong = History::new(None, vec![Arc::new(Analysis::of("unrelated"))]);
    cache.put(
        *history_keys(&keys).last().unwrap(),
        CachedAnalysis::History(Arc::new(wrong)),
    );
    assert_eq!(
        analyze_cached(&messages, None, &cache),
        analyze(&messages, None)
    );
}

#[test]
fn the_short_term_table_finds_what_it_holds() {
    let mut table = ShortTerms::default();
    let words: Vec<String> = (0..5000).map(|i| format!("w{i}")).collect();
    for (i, w) in words.iter().enumerate() {
        assert_eq!(table.insert(packed(w).unwrap(), i as u32), None);
    }
    assert_eq!(table.insert(packed("w7").unwrap(), 99), Some(7));
    for (i, w) in words.iter().enumerate() {
        let expected = if i == 7 { 99 } else { i as u32 };
        assert_eq!(table.get(packed(w).unwrap()), Some(&expected));
    }
    assert_eq!(table.get(packed("x1").unwrap()), None);
    assert_eq!(ShortTerms::default().get(packed("a").unwrap()), None);
}

#[test]
fn the_eight_byte_scan_agrees_with_the_class_table() {
    let text: Vec<u8> = (0u8..=255)
        .chain(
            b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                .iter()
                .copied(),
        )
        .chain((0u8..=127).rev())
        .collect();
    for start in 0..text.len() {
        let mut slow = start;
        while slow < text.len() && CLASS[text[slow] as usize] == ALNUM {
            slow += 1;
        }
        let fast = alnum_run_end(&text, start);
        // The scan stops early only at a byte that is not ASCII, where
        // the caller decodes the char.
        assert!(
            fast == slow || (fast < slow && text[fast..fast + 8].iter().any(|b| !b.is_ascii())),
            "{start}: {fast} vs {slow}"
        );
    }
}

#[test]
fn packed_keys_are_exact() {
    let words = [
        "",
        "a",
        "ab",
        "abc",
        "abcd",
        "abcde",
        "abcdefg",
        "abcdefgh",
        "abcdefghi",
        "abcdefghijklmno",
        "b",
        "ba",
        "abce",
        "abcdefgi",
        "abcdefghijklmnp",
        "\u{e5}r",
    ];
    let keys: Vec<u128> = words.iter().map(|w| packed(w).unwrap()).collect();
    for (i, a) in keys.iter().enumerate() {
        for (j, b) in keys.iter().enumerate() {
            assert_eq!(a == b, i == j, "{:?} {:?}", words[i], words[j]);
        }
    }
    for w in words {
        let bytes = w.as_bytes();
        let mut expected = [0u8; 16];
        expected[..bytes.len()].copy_from_slice(bytes);
        expected[15] = bytes.len() as u8;
        assert_eq!(packed(w), Some(u128::from_le_bytes(expected)), "{w:?}");
    }
    assert_eq!(packed("abcdefghijklmnop"), None);
}

#[test]
fn case_folds_beyond_ascii() {
    assert_eq!(terms("ÅRHUS Århus"), ["århus", "århus"]);
}

fn user(s: &str) -> Message<'static> {
    Message::new(Role::User, s)
}
fn assistant(s: &str) -> Message<'static> {
    Message::new(Role::Assistant, s)
}

#[test]
fn the_message_holding_the_asked_fact_ranks_first() {
    let messages = [
        user("The gate code for depot Norrby is 7731-KAPPA."),
        assistant("Noted. The depot at Sundby has a new gate."),
        Message::new(Role::Tool, "weather: sunny, 21 degrees"),
        user("Which code opens the gate at Norrby?"),
    ];
    let r = analyze(&messages, None);
    assert_eq!(r.query_index, Some(3));
    assert_eq!(r.query_terms, ["cod", "gat", "norrb", "open"]);
    assert_eq!(r.relevance[0], 1.0);
    assert!(
        r.relevance[1] > 0.0 && r.relevance[1] < 0.5,
        "{:?}",
        r.relevance
    );
    assert_eq!(r.relevance[2], 0.0);
    assert_eq!(r.relevance[3], 1.0, "the request itself");
}

#[test]
fn the_goal_adds_query_terms() {
    let messages = [
        assistant("The invoice total was 4410 EUR."),
        assistant("Shipping is by rail."),
        user("continue"),
    ];
    let without = analyze(&messages, None);
    assert_eq!(without.relevance[..2], [0.0, 0.0]);
    let with = analyze(&messages, Some("invoice totals"));
    assert_eq!(with.query_terms, ["continu", "invoic", "total"]);
    assert_eq!(with.relevance[..2], [1.0, 0.0]);
}

#[test]
fn no_user_message_and_no_goal_means_no_relevance() {
    let r = analyze(
        &[assistant("a b c"), Message::new(Role::System, "sys")],
        None,
    );
    assert_eq!((r.query_index, r.query_terms.len()), (None, 0));
    assert_eq!(r.relevance, [0.0, 0.0]);
}

#[test]
fn the_same_input_gives_the_same_bits() {
    let messages: Vec<Message> = (0..50)
        .map(|i| {
            assistant(&format!(
                "note {i}: alpha beta gamma-{} delta {}",
                i % 7,
                i * 13
            ))
        })
        .chain([user("what about gamma-3 and delta 39?")])
        .collect();
    let a = analyze(&messages, Some("alpha"));
    let b = analyze(&messages, Some("alpha"));
    assert_eq!(a, b);
    assert!(a.relevance.iter().all(|r| (0.0..=1.0).contains(r)));
}

/// A warm turn reads tool results' subjects (their calls' names and
/// arguments) from cached analyses: the same relevance as counting them
/// from the text.
#[test]
fn subjects_read_from_the_cache_score_as_counted_from_the_text() {
    let store = crate::analysis_store::AnalysisStore::new(1 << 20);
    let with_subject = |role, text: &str, subject: &str| {
        let mut m = Message::new(role, text);
        m.subject = subject.to_owned();
        m
    };
    let mut turn = vec![
        Message::new(Role::User, "Check the billing limits."),
        with_subject(
            Role::Tool,
            "max_connections = 640",
            "read_file {\"path\": \"deploy/billing/limits.toml\"}\n",
        ),
        with_subject(
            Role::Tool,
            "max_connections = 80",
            "read_file {\"path\": \"deploy/audit/limits.toml\"}\n",
        ),
        Message::new(Role::User, "What is max_connections for billing?"),
    ];
    // The first turn fills the store (outside a runtime, during the call).
    assert_eq!(analyze_cached(&turn, None, &store), analyze(&turn, None));
    turn.push(Message::new(Role::Assistant, "640."));
    turn.push(with_subject(
        Role::Tool,
        "timeout = 30s",
        "read_file {\"path\": \"deploy/billing/limits.toml\"}\n",
    ));
    turn.push(Message::new(
        Role::User,
        "And the billing timeout in limits.toml?",
    ));
    assert_eq!(analyze_cached(&turn, None, &store), analyze(&turn, None));
}

/// A store that counts its lookups.
struct CountingStore {
    store: crate::analysis_store::AnalysisStore,
    gets: std::cell::Cell<usize>,
}

impl AnalysisCache for CountingStore {
    fn get(&self, key: u128) -> Option<CachedAnalysis> {
        self.gets.set(self.gets.get() + 1);
        self.store.get(key)
    }
    fn put(&self, key: u128, value: CachedAnalysis) {
        self.store.put(key, value);
    }
}

/// Scoring the same messages again after some texts changed (the agent
/// passes' cuts, then the engine) reads only the changed texts, and
/// scores as scoring them anew would; a change that changes the query
/// (an alias defined) counts everything again, with the same result.
#[test]
fn a_rescore_after_texts_changed_counts_only_the_changed_ones() {
    let store = CountingStore {
        store: crate::analysis_store::AnalysisStore::new(1 << 20),
        gets: Default::default(),
    };
    let with_subject = |role, text: &str, subject: &str| {
        let mut m = Message::new(role, text);
        m.subject = subject.to_owned();
        m
    };
    let log = (0..40)
        .map(|i| format!("line {i}: worker Halden shipped batch {i}"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut turn = vec![
        Message::new(Role::User, "Watch the Halden workers."),
        with_subject(Role::Tool, &log, "tail_log {\"site\": \"halden\"}\n"),
        with_subject(
            Role::Tool,
            "rows: 12",
            "read_file {\"path\": \"depot.csv\"}\n",
        ),
        Message::new(Role::Assistant, "The northern depot shipped twelve."),
        Message::new(Role::User, "Which batch did the northern depot ship last?"),
    ];
    // Warm the store with the history, as an earlier turn would.
    analyze_cached(&turn, None, &store);
    let (first, keys, counted) = analyze_counted(&turn, None, &store, None, None);
    assert_eq!(first, analyze(&turn, None));
    let counted = counted.expect("the query has terms");

    // The passes cut the log: only it is read again.
    let mut cut = turn.clone();
    cut[1].content = "line 0: worker Halden shipped batch 0\n[… 1,200 chars omitted …]".into();
    let mut cut_keys = keys.clone().unwrap();
    cut_keys[1] = message_key(&cut[1].content);
    store.gets.set(0);
    let (again, _, _) = analyze_counted(&cut, None, &store, Some(cut_keys), Some(&counted));
    assert_eq!(again, analyze(&cut, None));
    assert_eq!(store.gets.get(), 1, "only the cut text is looked up");

    // A changed text that defines an alias changes the query.
    turn[3].content = "Halden, also known as the northern depot, shipped twelve.".into();
    let mut alias_keys = keys.unwrap();
    alias_keys[3] = message_key(&turn[3].content);
    let (aliased, _, _) = analyze_counted(&turn, None, &store, Some(alias_keys), Some(&counted));
    assert_eq!(aliased, analyze(&turn, None));
    assert!(aliased.query_terms.iter().any(|t| t == "halden"));
}

/// A warm turn finds the previous turn's subjects (calls' names and
/// arguments) as one history, not with a lookup per result.
#[test]
fn a_warm_turn_finds_the_earlier_subjects_with_one_lookup() {
    let store = CountingStore {
        store: crate::analysis_store::AnalysisStore::new(1 << 20),
        gets: Default::default(),
    };
    let result = |n: usize| {
        let mut m = Message::new(Role::Tool, format!("rows: {n}"));
        m.subject = format!("read_file {{\"path\": \"depot-{n}.csv\"}}\n");
        m
    };
    let mut turn = vec![Message::new(Role::User, "Read the depot files.")];
    turn.extend((0..30).map(result));
    turn.push(Message::new(Role::User, "How many rows has depot-7.csv?"));
    analyze_cached(&turn, None, &store);
    turn.push(Message::new(Role::Assistant, "12 rows."));
    turn.push(result(30));
    turn.push(Message::new(Role::User, "And depot-30.csv?"));
    store.gets.set(0);
    assert_eq!(analyze_cached(&turn, None, &store), analyze(&turn, None));
    // Probes for the earlier history and subjects, the new texts: not 31
    // subjects one by one.
    assert!(store.gets.get() <= 12, "{} lookups", store.gets.get());
}
