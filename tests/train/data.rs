//! The SFT data pipeline of liger-train: JSONL rows and their line-numbered errors under
//! each policy, the prompt template's loss mask against an independent tokenization of
//! prompt and response, padding and packing invariants, and the seeded data order.
//!
//! Inputs are random from a fresh seed each run (`LIGER_SEED` reruns one; every failure
//! message names it).

use liger_models::IGNORE_INDEX;
use liger_train::batching::{
    self, BatchStream, Cursor, Layout, PAD_MULTIPLE, assign_rows, epoch_batches, shuffled_order,
};
use liger_train::bundled;
use liger_train::data::{self, BadLinePolicy, DataOptions, Row, TooLongPolicy, parse_jsonl};
use liger_train::prompt::{Tokenized, tokenize_row};
use liger_train::{LineError, TrainError};
use liger_verify::conformance::Rng;
use std::str::FromStr;

const FILE: &str = "data/train.jsonl";

const WORDS: [&str; 16] = [
    "apple",
    "river",
    "7",
    "stone",
    "cloud",
    "42 + 17",
    "window",
    "Zebra",
    "été",
    "naïve",
    "x",
    "",
    "multi word phrase",
    "tab\there",
    "line\nbreak",
    "quote \"q\"",
];

fn words(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[rng.below(WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A random valid row (all three shapes: with input, without the key, text) and its JSON.
fn random_row(rng: &mut Rng) -> (Row, String) {
    match rng.below(4) {
        0 => {
            let n = 1 + rng.below(6);
            let text = format!("t{}", words(rng, n));
            let json = serde_json::json!({ "text": text }).to_string();
            (Row::Text { text }, json)
        }
        1 => {
            let (instruction, output) = (format!("i {}", words(rng, 3)), words(rng, 2));
            let json =
                serde_json::json!({ "instruction": instruction, "output": output, "extra": 1 })
                    .to_string();
            (
                Row::Instruction {
                    instruction,
                    input: None,
                    output,
                },
                json,
            )
        }
        _ => {
            let (instruction, input, output) =
                (format!("i {}", words(rng, 3)), words(rng, 2), words(rng, 2));
            let json =
                serde_json::json!({ "instruction": instruction, "input": input, "output": output })
                    .to_string();
            (
                Row::Instruction {
                    instruction,
                    input: Some(input),
                    output,
                },
                json,
            )
        }
    }
}

/// Every kind of bad line, with a check of the error it must give.
fn bad_lines() -> Vec<(&'static str, fn(&LineError) -> bool)> {
    vec![
        ("{\"instruction\": \"x\", \"output\": ", |e| {
            matches!(e, LineError::InvalidJson { .. })
        }),
        ("not json at all", |e| {
            matches!(e, LineError::InvalidJson { .. })
        }),
        (
            "[1, 2, 3]",
            |e| matches!(e, LineError::InvalidJson { message, .. } if message.contains("an array")),
        ),
        ("{\"instruction\": \"no output\"}", |e| {
            matches!(
                e,
                LineError::MissingField {
                    field: "output",
                    ..
                }
            )
        }),
        ("{\"output\": \"no instruction\"}", |e| {
            matches!(
                e,
                LineError::MissingField {
                    field: "instruction",
                    ..
                }
            )
        }),
        ("{\"prompt\": \"neither kind\"}", |e| {
            matches!(e, LineError::MissingField { .. })
        }),
        ("{\"instruction\": \"x\", \"output\": 5}", |e| {
            matches!(
                e,
                LineError::BadField {
                    field: "output",
                    ..
                }
            )
        }),
        ("{\"text\": [\"a\"]}", |e| {
            matches!(e, LineError::BadField { field: "text", .. })
        }),
        (
            "{\"instruction\": \"x\", \"input\": 3, \"output\": \"y\"}",
            |e| matches!(e, LineError::BadField { field: "input", .. }),
        ),
        (
            "{\"text\": \"a\", \"instruction\": \"b\", \"output\": \"c\"}",
            |e| matches!(e, LineError::BadField { field: "text", .. }),
        ),
    ]
}

#[test]
fn every_bad_line_is_reported_with_file_and_line_under_both_policies() {
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    for (bad, check) in bad_lines() {
        // Valid rows, blank lines and the bad line at a random position.
        let n = 3 + rng.below(12);
        let at = rng.below(n);
        let mut lines = Vec::new();
        let mut expected = Vec::new();
        for i in 0..n {
            if i == at {
                lines.push(bad.to_string());
            } else if rng.below(5) == 0 {
                lines.push("   ".to_string());
            } else {
                let (row, json) = random_row(&mut rng);
                lines.push(json);
                expected.push((i + 1, row));
            }
        }
        let text = lines.join("\n");
        let ctx = format!("bad line {bad:?} at line {} (seed {seed})", at + 1);

        let err = parse_jsonl(&text, FILE, BadLinePolicy::Fail).expect_err(&ctx);
        assert!(check(&err), "{ctx}: wrong error {err:?}");
        assert_eq!(err.line(), at + 1, "{ctx}: {err}");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("{FILE}:{}: ", at + 1)),
            "{ctx}: message must start with file:line: {msg}"
        );

        let parsed = parse_jsonl(&text, FILE, BadLinePolicy::Skip).expect(&ctx);
        assert_eq!(parsed.skipped.len(), 1, "{ctx}");
        assert_eq!(parsed.skipped[0], err, "{ctx}: skip reports the same error");
        let got: Vec<(usize, Row)> = parsed.rows.into_iter().map(|r| (r.line, r.row)).collect();
        assert_eq!(got, expected, "{ctx}: the valid rows, with their lines");

        // `prepare` applies the same policy before anything is tokenized.
        let tok = bundled::tokenizer();
        let opts = |on_bad_line| DataOptions {
            max_length: 4096,
            on_bad_line,
            on_too_long: TooLongPolicy::Fail,
        };
        match data::prepare(&text, FILE, &tok, opts(BadLinePolicy::Fail)) {
            Err(TrainError::Data(e)) => assert_eq!(e, err, "{ctx}"),
            other => panic!(
                "{ctx}: prepare under fail gave {:?}",
                other.map(|d| d.examples.len())
            ),
        }
        if !expected.is_empty() {
            let d = data::prepare(&text, FILE, &tok, opts(BadLinePolicy::Skip)).expect(&ctx);
            assert_eq!(d.examples.len(), expected.len(), "{ctx}");
            assert_eq!(d.skipped, vec![err], "{ctx}");
            let lines: Vec<usize> = d.examples.iter().map(|e| e.line).collect();
            assert_eq!(
                lines,
                expected.iter().map(|e| e.0).collect::<Vec<_>>(),
                "{ctx}"
            );
        }
    }
}

#[test]
fn a_file_with_no_usable_row_is_an_error_naming_it() {
    let tok = bundled::tokenizer();
    let opts = DataOptions {
        max_length: 64,
        on_bad_line: BadLinePolicy::Skip,
        on_too_long: TooLongPolicy::Skip,
    };
    match data::prepare("garbage\n{\"x\": 1}\n\n", FILE, &tok, opts) {
        Err(e @ TrainError::NoData { .. }) => {
            let m = e.to_string();
            assert!(
                m.contains(FILE) && m.contains("2 rows read, 2 skipped"),
                "{m}"
            );
        }
        other => panic!("expected NoData, got {:?}", other.map(|d| d.examples.len())),
    }
}

/// The template, written again here from its documentation (not from the crate's code).
fn expected_prompt(instruction: &str, input: Option<&str>) -> String {
    let mut p = String::from("### Instruction:\n");
    p += instruction;
    p += "\n\n";
    if let Some(i) = input.filter(|i| !i.is_empty()) {
        p += "### Input:\n";
        p += i;
        p += "\n\n";
    }
    p + "### Response:\n"
}

#[test]
fn exactly_the_response_and_eos_are_trained() {
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    let tok = bundled::tokenizer();
    // An independent tokenizer instance from the same JSON, used directly.
    let hf = tokenizers::Tokenizer::from_str(bundled::TOKENIZER).unwrap();
    let enc = |s: &str| -> Vec<u32> {
        if s.is_empty() {
            return Vec::new();
        }
        hf.encode(s, false).unwrap().get_ids().to_vec()
    };
    let bos = hf.token_to_id("<bos>").unwrap();
    let eos = hf.token_to_id("<eos>").unwrap();
    assert_eq!((tok.specials.bos, tok.specials.eos), (Some(bos), eos));
    assert_eq!(tok.specials.pad, hf.token_to_id("<pad>").unwrap());
    for case in 0..200 {
        let (row, _) = random_row(&mut rng);
        let (prompt, response) = match &row {
            Row::Instruction {
                instruction,
                input,
                output,
            } => (
                enc(&expected_prompt(instruction, input.as_deref())),
                enc(output),
            ),
            Row::Text { text } => (Vec::new(), enc(text)),
        };
        let ex = tokenize_row(&tok, &row, case + 1).unwrap();
        let mut ids = vec![bos];
        ids.extend(&prompt);
        ids.extend(&response);
        ids.push(eos);
        let ctx = format!("row {row:?} (seed {seed})");
        assert_eq!(ex.input_ids, ids, "{ctx}");
        let trained_from = 1 + prompt.len();
        for (t, (&label, &id)) in ex.labels.iter().zip(&ex.input_ids).enumerate() {
            let want = if t >= trained_from {
                id as i64
            } else {
                IGNORE_INDEX
            };
            assert_eq!(label, want, "{ctx}: label {t}");
        }
        assert_eq!(ex.trained(), response.len() + 1, "{ctx}");
        // The decoded response part is the output text.
        let text = match &row {
            Row::Instruction { output, .. } => output,
            Row::Text { text } => text,
        };
        assert_eq!(&tok.decode(&response).unwrap(), text, "{ctx}");
    }
}

#[test]
fn too_long_examples_follow_the_policy_with_their_line() {
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    let tok = bundled::tokenizer();
    let short = r#"{"instruction": "Add.", "input": "1 + 2", "output": "3"}"#;
    let long_output = format!(
        r#"{{"instruction": "Copy.", "output": "{}"}}"#,
        "apple river stone ".repeat(20)
    );
    let long_prompt = format!(
        r#"{{"instruction": "{}", "output": "ok"}}"#,
        "apple river stone ".repeat(20)
    );
    let n = 4 + rng.below(8);
    // Two distinct lines.
    let a = rng.below(n);
    let b = (a + 1 + rng.below(n - 1)) % n;
    let lines: Vec<&str> = (0..n)
        .map(|i| {
            if i == a {
                long_output.as_str()
            } else if i == b {
                long_prompt.as_str()
            } else {
                short
            }
        })
        .collect();
    let text = lines.join("\n");
    let short_len = tokenize_row(&tok, &data::parse_line(short, FILE, 1).unwrap(), 1)
        .unwrap()
        .len();
    let max_length = short_len + 4 + rng.below(8);
    let ctx = format!(
        "long output at line {}, long prompt at line {} (seed {seed})",
        a + 1,
        b + 1
    );
    let opts = |on_too_long| DataOptions {
        max_length,
        on_bad_line: BadLinePolicy::Fail,
        on_too_long,
    };

    match data::prepare(&text, FILE, &tok, opts(TooLongPolicy::Fail)) {
        Err(TrainError::Data(e @ LineError::TooLong { .. })) => {
            assert_eq!(e.line(), a.min(b) + 1, "{ctx}");
            assert!(
                e.to_string()
                    .starts_with(&format!("{FILE}:{}: ", a.min(b) + 1)),
                "{ctx}: {e}"
            );
        }
        other => panic!("{ctx}: {:?}", other.map(|d| d.examples.len())),
    }

    let d = data::prepare(&text, FILE, &tok, opts(TooLongPolicy::Skip)).expect(&ctx);
    let mut skipped: Vec<usize> = d.skipped.iter().map(LineError::line).collect();
    skipped.sort();
    let mut both = vec![a + 1, b + 1];
    both.sort();
    assert_eq!(skipped, both, "{ctx}");
    assert_eq!(d.examples.len(), n - 2, "{ctx}");

    // Truncation keeps the long output's first tokens; the long prompt leaves no response
    // token within max_length, so it is left out (and reported).
    let d = data::prepare(&text, FILE, &tok, opts(TooLongPolicy::Truncate)).expect(&ctx);
    assert_eq!(d.truncated, vec![a + 1], "{ctx}");
    assert_eq!(
        d.skipped.iter().map(LineError::line).collect::<Vec<_>>(),
        vec![b + 1],
        "{ctx}"
    );
    let cut = d.examples.iter().find(|e| e.line == a + 1).expect(&ctx);
    let full = tokenize_row(&tok, &data::parse_line(&long_output, FILE, 1).unwrap(), 1).unwrap();
    assert_eq!(cut.len(), max_length, "{ctx}");
    assert_eq!(cut.input_ids[..], full.input_ids[..max_length], "{ctx}");
    assert_eq!(cut.labels[..], full.labels[..max_length], "{ctx}");
    assert!(d.examples.iter().all(|e| e.len() <= max_length), "{ctx}");
}

/// Random examples with random lengths and masks (first label always masked).
fn random_examples(rng: &mut Rng, n: usize, max_len: usize) -> Vec<Tokenized> {
    (0..n)
        .map(|i| {
            let len = 2 + rng.below(max_len - 1);
            let prompt = rng.below(len);
            let input_ids: Vec<u32> = (0..len).map(|_| 3 + rng.below(1000) as u32).collect();
            let labels = input_ids
                .iter()
                .enumerate()
                .map(|(t, &id)| {
                    if t == 0 || t < prompt {
                        IGNORE_INDEX
                    } else {
                        id as i64
                    }
                })
                .collect();
            Tokenized {
                input_ids,
                labels,
                line: i + 1,
            }
        })
        .collect()
}

#[test]
fn padding_keeps_every_token_and_masks_the_padding() {
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    for _ in 0..20 {
        let max_length = 8 + rng.below(60);
        let n = 1 + rng.below(40);
        let examples = random_examples(&mut rng, n, max_length);
        let batch_size = 1 + rng.below(6);
        let pad = 0;
        let epoch = rng.below(3);
        let batches = epoch_batches(
            &examples,
            seed,
            epoch,
            Layout::Pad,
            batch_size,
            max_length,
            pad,
        );
        let ctx = format!("max_length {max_length}, batch {batch_size} (seed {seed})");
        let mut seen = vec![0usize; examples.len()];
        for (k, b) in batches.iter().enumerate() {
            let longest = b.rows.iter().map(|r| examples[r[0]].len()).max().unwrap();
            assert!(
                b.batch <= batch_size && (b.batch == batch_size || k == batches.len() - 1),
                "{ctx}"
            );
            assert_eq!(b.input_ids.len(), b.batch * b.seq, "{ctx}");
            assert_eq!(b.labels.len(), b.batch * b.seq, "{ctx}");
            assert!(
                b.seq >= longest && b.seq <= max_length.max(2),
                "{ctx}: seq {}",
                b.seq
            );
            assert!(
                b.seq % PAD_MULTIPLE == 0 || b.seq == max_length,
                "{ctx}: seq {}",
                b.seq
            );
            assert!(
                b.seq < longest + PAD_MULTIPLE,
                "{ctx}: seq {} for longest {longest}",
                b.seq
            );
            let mut trained = 0;
            for (r, row) in b.rows.iter().enumerate() {
                assert_eq!(row.len(), 1, "{ctx}: one example per row");
                let ex = &examples[row[0]];
                seen[row[0]] += 1;
                let ids = &b.input_ids[r * b.seq..(r + 1) * b.seq];
                let labels = &b.labels[r * b.seq..(r + 1) * b.seq];
                for t in 0..b.seq {
                    if t < ex.len() {
                        assert_eq!(ids[t], ex.input_ids[t] as i64, "{ctx}");
                        assert_eq!(labels[t], ex.labels[t], "{ctx}");
                    } else {
                        assert_eq!(
                            (ids[t], labels[t]),
                            (pad as i64, IGNORE_INDEX),
                            "{ctx}: padding"
                        );
                    }
                }
                trained += ex.trained();
            }
            assert_eq!(b.trained, trained, "{ctx}");
            assert_eq!(
                b.trained,
                b.labels.iter().filter(|&&l| l != IGNORE_INDEX).count(),
                "{ctx}"
            );
            assert_eq!(
                b.tokens,
                b.rows.iter().map(|r| examples[r[0]].len()).sum::<usize>(),
                "{ctx}"
            );
        }
        assert!(
            seen.iter().all(|&s| s == 1),
            "{ctx}: every example exactly once per epoch"
        );
    }
}

#[test]
fn packing_keeps_every_token_and_masks_example_boundaries() {
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    for _ in 0..20 {
        let max_length = 8 + rng.below(120);
        let n = 1 + rng.below(60);
        let examples = random_examples(&mut rng, n, max_length);
        let batch_size = 1 + rng.below(5);
        let pad = 1 + rng.below(2) as u32;
        let epoch = rng.below(3);
        let ctx =
            format!("max_length {max_length}, batch {batch_size}, epoch {epoch} (seed {seed})");
        let order = shuffled_order(examples.len(), seed, epoch);
        let rows = assign_rows(&examples, &order, Layout::Pack, max_length);
        // Rows hold the shuffled order, in order, greedily: the next example did not fit.
        assert_eq!(rows.concat(), order, "{ctx}");
        for w in rows.windows(2) {
            let used: usize = w[0].iter().map(|&i| examples[i].len()).sum();
            assert!(used + examples[w[1][0]].len() > max_length, "{ctx}: greedy");
        }
        let batches = epoch_batches(
            &examples,
            seed,
            epoch,
            Layout::Pack,
            batch_size,
            max_length,
            pad,
        );
        assert_eq!(
            batches
                .iter()
                .flat_map(|b| b.rows.clone())
                .collect::<Vec<_>>(),
            rows,
            "{ctx}"
        );
        let mut stream_tokens = Vec::new();
        for b in &batches {
            assert_eq!(b.shape(), [b.batch, max_length.max(2)], "{ctx}");
            for (r, row) in b.rows.iter().enumerate() {
                let ids = &b.input_ids[r * b.seq..(r + 1) * b.seq];
                let labels = &b.labels[r * b.seq..(r + 1) * b.seq];
                let mut t = 0;
                for &i in row {
                    let ex = &examples[i];
                    for k in 0..ex.len() {
                        stream_tokens.push(ids[t]);
                        assert_eq!(ids[t], ex.input_ids[k] as i64, "{ctx}");
                        let want = if k == 0 { IGNORE_INDEX } else { ex.labels[k] };
                        assert_eq!(labels[t], want, "{ctx}: label {k} of example {i}");
                        t += 1;
                    }
                }
                assert!(t <= max_length, "{ctx}");
                for k in t..b.seq {
                    assert_eq!(
                        (ids[k], labels[k]),
                        (pad as i64, IGNORE_INDEX),
                        "{ctx}: padding"
                    );
                }
            }
            let trained: usize = b
                .rows
                .iter()
                .flatten()
                .map(|&i| examples[i].trained())
                .sum();
            assert_eq!(
                b.trained, trained,
                "{ctx}: first labels were already masked"
            );
        }
        let all: Vec<i64> = order
            .iter()
            .flat_map(|&i| examples[i].input_ids.iter().map(|&x| x as i64))
            .collect();
        assert_eq!(stream_tokens, all, "{ctx}: no token lost or repeated");
    }
}

#[test]
fn the_order_depends_only_on_seed_and_epoch_and_resumes_mid_epoch() {
    let mut rng = liger_tests::fresh_rng();
    let seed = rng.seed();
    let n = 50 + rng.below(200);
    let a = shuffled_order(n, seed, 0);
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..n).collect::<Vec<_>>(),
        "a permutation (seed {seed})"
    );
    assert_eq!(a, shuffled_order(n, seed, 0), "deterministic (seed {seed})");
    assert_ne!(a, shuffled_order(n, seed, 1), "epochs differ (seed {seed})");
    assert_ne!(
        a,
        shuffled_order(n, seed ^ 1, 0),
        "seeds differ (seed {seed})"
    );

    // A stream restarted at a cursor continues exactly as the uninterrupted one, also
    // across epoch boundaries.
    let n = 5 + rng.below(20);
    let examples = random_examples(&mut rng, n, 16);
    let layout = if rng.below(2) == 0 {
        Layout::Pad
    } else {
        Layout::Pack
    };
    let mut full = BatchStream::new(&examples, seed, layout, 3, 16, 0, Cursor::default());
    let stop = 1 + rng.below(30);
    let mut cursor = Cursor::default();
    let mut expected = Vec::new();
    for i in 0..stop + 20 {
        if i == stop {
            cursor = full.cursor();
        }
        let b = full.next_batch();
        if i >= stop {
            expected.push(b);
        }
    }
    let mut resumed = BatchStream::new(&examples, seed, layout, 3, 16, 0, cursor);
    let got: Vec<batching::Batch> = (0..20).map(|_| resumed.next_batch()).collect();
    assert_eq!(
        got, expected,
        "resumed at {cursor:?} ({layout:?}, seed {seed})"
    );
}

#[test]
fn the_bundled_data_prepares_cleanly() {
    let tok = bundled::tokenizer();
    let d = data::prepare(
        bundled::DATASET,
        bundled::DATASET_NAME,
        &tok,
        DataOptions {
            max_length: 256,
            on_bad_line: BadLinePolicy::Fail,
            on_too_long: TooLongPolicy::Fail,
        },
    )
    .unwrap();
    assert_eq!(d.examples.len(), 3000);
    assert!(d.skipped.is_empty() && d.truncated.is_empty());
    assert!(d.examples.iter().all(|e| e.trained() >= 1));
    assert!(bundled::TOKENIZER.len() < 1 << 20 && bundled::DATASET.len() < 1 << 20);
    assert_eq!(tok.vocab_size(), 1024);
}
