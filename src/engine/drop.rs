//! Stage 4, drop: remove unprotected messages, lowest score first (older
//! first on a tie), until the budget is met. A grouped message takes the
//! rest of its group with it.

use rustc_hash::FxHashMap;

use super::score::Scores;
use super::{round_to, DropRule, DropStage, Dropped, Working, DROP_ORDER, WEIGHTS};

pub(super) fn run(work: &mut Working, scores: &Scores) -> DropStage {
    let mut order: Vec<usize> = work.candidates().collect();
    order.sort_by(|&a, &b| scores.score(a).total_cmp(&scores.score(b)).then(a.cmp(&b)));

    let mut groups: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
    for (i, m) in work.messages.iter().enumerate() {
        if let Some(g) = m.group {
            groups.entry(g).or_default().push(i);
        }
    }

    let mut dropped = Vec::new();
    for i in order {
        if work.fits() {
            break;
        }
        if !work.present[i] {
            continue; // already dropped with its group
        }
        let mates = work.messages[i].group.and_then(|g| groups.get(&g));
        let members = std::iter::once(i).chain(
            mates
                .into_iter()
                .flatten()
                .copied()
                .filter(|&k| k != i && work.present[k]),
        );
        for k in members.collect::<Vec<_>>() {
            dropped.push(Dropped {
                index: k,
                score: round_to(scores.score(k), 6),
                chars: work.chars(k),
            });
            work.remove(k);
        }
    }
    DropStage {
        stage: "drop",
        order: 4,
        dropped_messages: dropped.len(),
        dropped,
        rule: DropRule {
            weights: WEIGHTS,
            order: DROP_ORDER,
            protected_never_dropped: true,
        },
    }
}
