//! Randomized properties of the cursor crate, each checked against a naive
//! `BTreeMap` model or against the codec's own inverse.
//!
//! What they prove:
//!
//! - the token codec round-trips every vector, binary and text, and its size
//!   is exactly the formula in `docs/TOKEN.md`;
//! - decoding is canonical: any bytes (or text) that decode are exactly what
//!   the encoder writes for the result, so one vector has one token; the
//!   inputs are helped past the header (a valid version byte and checksum
//!   around random or mutated bodies), and decoding never panics;
//! - join is commutative, associative and idempotent, and is the per-stream
//!   maximum;
//! - `dominates`, `concurrent`, `==` and `PartialOrd` agree with the model;
//! - `check_floor` answers exactly the model's lost ranges and resume cursor,
//!   and the resume cursor passes the same floor;
//! - version 2: a cursor relative to a checkpoint round-trips through
//!   `encode_relative` and `decode_any` and expands back to itself, with the
//!   documented size, or is refused exactly when the model says (more than
//!   `CHECKPOINT_DIFF_MAX` differing streams, a difference past an `i64`);
//!   any bytes that decode as version 2 are exactly what the encoder writes,
//!   expansion against the named checkpoint is the model's sum or a typed
//!   refusal and against any other is `CheckpointMismatch`; and
//!   `decode_any` reads every version-1 input exactly as `decode` does.
//!
//! How: every property runs under `quickcheck` with a seeded generator. The
//! seed is `MESHLOG_SEED` if set, else drawn from the clock, and a failure
//! panics with the seed and the line to replay it
//! (`MESHLOG_SEED=<seed> cargo test -p meshlog-cursor --test properties`).
//! `MESHLOG_QC_TESTS=<factor>` multiplies every property's case count; the
//! defaults keep the file to a few seconds in a debug build. Properties whose
//! inputs could miss the interesting cases also count what they saw (decoded
//! tokens, each order relation, stale and fresh cursors) and fail if a case
//! never came up.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use meshlog_cursor::token::{self, Token, TokenError, CHECKPOINT_DIFF_MAX};
use meshlog_cursor::{Checkpoint, StreamId, VersionVector};
use quickcheck::{Arbitrary, Gen, QuickCheck, Testable};

/// The generator's size: the usual number of entries in a vector.
const GEN_SIZE: usize = 40;

/// The run's seed: `MESHLOG_SEED`, or the clock. One seed for every property
/// of the run, so one number replays them all.
fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let seed = meshlog_testkit::seed::fresh();
        eprintln!("meshlog-cursor properties: seed {seed} (replay with MESHLOG_SEED={seed})");
        seed
    })
}

/// `MESHLOG_QC_TESTS`: a factor on every property's case count (default 1).
fn tests_factor() -> u64 {
    match std::env::var("MESHLOG_QC_TESTS") {
        Ok(text) => match text.trim().parse() {
            Ok(factor) if factor >= 1 => factor,
            _ => panic!("MESHLOG_QC_TESTS={text:?} is not a factor of at least 1"),
        },
        Err(_) => 1,
    }
}

/// Runs `property` on `tests` seeded cases (times the factor); on failure,
/// panics with the seed, the replay command and quickcheck's shrunk witness.
fn check<A: Testable>(name: &str, tests: u64, property: A) {
    let seed = seed();
    let tests = tests * tests_factor();
    let outcome = QuickCheck::new()
        .rng(Gen::from_size_and_seed(GEN_SIZE, seed))
        .tests(tests)
        .max_tests(tests)
        .quicktest(property);
    match outcome {
        Ok(passed) => assert_eq!(passed, tests, "{name}: cases were discarded"),
        Err(failure) => panic!(
            "property {name} failed with seed {seed}; replay with MESHLOG_SEED={seed} \
             cargo test -p meshlog-cursor --test properties\n{failure:?}"
        ),
    }
}

/// Fails with the seed when a run never met a case a property must meet.
fn assert_seen(name: &str, what: &str, counter: &AtomicU64) {
    let seed = seed();
    assert!(
        counter.load(Relaxed) > 0,
        "property {name} never met {what} with seed {seed}; the generator is too narrow \
         (replay with MESHLOG_SEED={seed})"
    );
}

// ---------------------------------------------------------------- generators

/// A draw from quickcheck's generator in `0..n`.
fn below(g: &mut Gen, n: u64) -> u64 {
    u64::arbitrary(g) % n
}

/// A stream id: small ids (0..8) so vectors share streams, random 64-bit ids,
/// random 32-bit ids (as Yjs client ids are), and the top of the id space.
fn stream_id(g: &mut Gen) -> u64 {
    match below(g, 8) {
        0..=3 => below(g, 8),
        4 | 5 => u64::arbitrary(g),
        6 => u64::arbitrary(g) >> 32,
        _ => u64::MAX - below(g, 3),
    }
}

/// A seq: 1, small (across the one-byte varint limit at 128), huge, the
/// largest, and now and then 0, which a vector ignores.
fn seq(g: &mut Gen) -> u64 {
    match below(g, 16) {
        0..=2 => 1,
        3..=10 => 1 + below(g, 300),
        11..=12 => u64::arbitrary(g),
        13 => u64::MAX - below(g, 2),
        14 => 1 << below(g, 64),
        _ => 0,
    }
}

/// Raw entries `(stream, seq)` for a vector, in any order, with repeated
/// streams and zero seqs: `VersionVector::from_iter` keeps the maximum per
/// stream and drops zeros, and so does the model.
#[derive(Clone, Debug)]
struct Entries(Vec<(u64, u64)>);

impl Entries {
    fn vector(&self) -> VersionVector {
        self.0
            .iter()
            .map(|&(stream, seq)| (StreamId::new(stream), seq))
            .collect()
    }

    fn model(&self) -> Model {
        let mut model = Model::new();
        for &(stream, seq) in &self.0 {
            if seq > 0 {
                let entry = model.entry(stream).or_insert(0);
                *entry = (*entry).max(seq);
            }
        }
        model
    }

    /// Few streams and small seqs, so that two draws often share streams
    /// and compare every way.
    fn tiny(g: &mut Gen) -> Entries {
        let len = below(g, 5);
        Entries((0..len).map(|_| (below(g, 4), below(g, 4))).collect())
    }
}

impl Arbitrary for Entries {
    fn arbitrary(g: &mut Gen) -> Entries {
        let len = match below(g, 16) {
            0 => return Entries::tiny(g),
            // Now and then past 127 streams: the count takes two bytes.
            1 => 100 + below(g, 200),
            _ => below(g, g.size() as u64 + 1),
        };
        Entries((0..len).map(|_| (stream_id(g), seq(g))).collect())
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Entries>> {
        Box::new(self.0.shrink().map(Entries))
    }
}

/// Two vectors that are often related: independent draws, tiny draws, and
/// one derived from the other by raising, lowering, dropping or adding
/// streams, so every order relation and both staleness outcomes come up.
#[derive(Clone, Debug)]
struct Pair(Entries, Entries);

impl Arbitrary for Pair {
    fn arbitrary(g: &mut Gen) -> Pair {
        match below(g, 4) {
            0 => Pair(Entries::tiny(g), Entries::tiny(g)),
            1 => Pair(Entries::arbitrary(g), Entries::arbitrary(g)),
            _ => {
                let source = Entries::arbitrary(g);
                // 0: unchanged, 1: only raised, 2: only lowered, 3: mixed.
                let direction = below(g, 4);
                let mut derived: Vec<(u64, u64)> = source
                    .model()
                    .into_iter()
                    .filter_map(|(stream, seq)| {
                        let raise = match direction {
                            0 => return Some((stream, seq)),
                            1 => true,
                            2 => false,
                            _ => bool::arbitrary(g),
                        };
                        let step = below(g, 3);
                        if raise {
                            Some((stream, seq.saturating_add(step)))
                        } else if below(g, 4) == 0 {
                            None
                        } else {
                            Some((stream, seq.saturating_sub(step)))
                        }
                    })
                    .collect();
                if direction == 1 || (direction == 3 && bool::arbitrary(g)) {
                    derived.push((stream_id(g), seq(g)));
                }
                let derived = Entries(derived);
                if bool::arbitrary(g) {
                    Pair(source, derived)
                } else {
                    Pair(derived, source)
                }
            }
        }
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Pair>> {
        Box::new(
            (self.0.clone(), self.1.clone())
                .shrink()
                .map(|(a, b)| Pair(a, b)),
        )
    }
}

/// Bytes for the decoder: wholly arbitrary, or a body (random, or a real
/// token's body with a few edits) between a valid version byte and a valid
/// checksum, so most inputs reach the entries.
#[derive(Clone, Debug)]
enum TokenBytes {
    Raw(Vec<u8>),
    Framed(Vec<u8>),
}

impl TokenBytes {
    fn bytes(&self) -> Vec<u8> {
        match self {
            TokenBytes::Raw(bytes) => bytes.clone(),
            TokenBytes::Framed(body) => {
                let mut bytes = vec![token::TOKEN_VERSION];
                bytes.extend_from_slice(body);
                let crc = crc32fast::hash(&bytes);
                bytes.extend_from_slice(&crc.to_le_bytes());
                bytes
            }
        }
    }
}

/// A byte the varint reader finds interesting more often than chance would.
fn edge_byte(g: &mut Gen) -> u8 {
    match below(g, 3) {
        0 => *g
            .choose(&[0x00, 0x01, 0x02, 0x7f, 0x80, 0x81, 0xfe, 0xff])
            .unwrap(),
        1 => below(g, 4) as u8,
        _ => u8::arbitrary(g),
    }
}

impl Arbitrary for TokenBytes {
    fn arbitrary(g: &mut Gen) -> TokenBytes {
        match below(g, 4) {
            0 => TokenBytes::Raw(Vec::arbitrary(g)),
            1 => {
                let len = below(g, 24);
                TokenBytes::Framed((0..len).map(|_| edge_byte(g)).collect())
            }
            _ => {
                let vector = Entries::arbitrary(g).vector();
                let token = token::encode(&vector).expect("within STREAMS_MAX");
                // The body without the version byte and the checksum.
                let mut body = token[1..token.len() - 4].to_vec();
                for _ in 0..below(g, 4) {
                    let at = below(g, body.len() as u64 + 1) as usize;
                    match below(g, 7) {
                        // Claim one more entry than there is, and add two
                        // bytes for it: past the last id, a stream overflow.
                        6 if body.first().is_some_and(|&count| count < 0x7f) => {
                            body[0] += 1;
                            body.extend([edge_byte(g), edge_byte(g)]);
                        }
                        0 if at < body.len() => body[at] ^= 1 << below(g, 8),
                        1 if at < body.len() => body[at] = edge_byte(g),
                        2 => body.insert(at, edge_byte(g)),
                        3 if at < body.len() => {
                            body.remove(at);
                        }
                        4 => body.truncate(at),
                        _ => {
                            let copy = body[at..].to_vec();
                            body.extend(copy.into_iter().take(below(g, 12) as usize));
                        }
                    }
                }
                TokenBytes::Framed(body)
            }
        }
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = TokenBytes>> {
        match self {
            TokenBytes::Raw(bytes) => Box::new(bytes.shrink().map(TokenBytes::Raw)),
            TokenBytes::Framed(body) => Box::new(body.shrink().map(TokenBytes::Framed)),
        }
    }
}

/// Text for the text decoder: arbitrary strings, and the base64 of
/// [`TokenBytes`] with a few edits (a character replaced by any URL-safe
/// character, which may set unused trailing bits; one dropped or added;
/// padding; a character outside the alphabet).
#[derive(Clone, Debug)]
struct TokenText(String);

const URL_SAFE: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

impl Arbitrary for TokenText {
    fn arbitrary(g: &mut Gen) -> TokenText {
        if below(g, 8) == 0 {
            return TokenText(String::arbitrary(g));
        }
        let mut text: Vec<char> = URL_SAFE_NO_PAD
            .encode(TokenBytes::arbitrary(g).bytes())
            .chars()
            .collect();
        for _ in 0..below(g, 3) {
            let at = below(g, text.len() as u64 + 1) as usize;
            let safe = char::from(*g.choose(URL_SAFE).unwrap());
            match below(g, 6) {
                // The last character most often: its unused bits.
                0 if !text.is_empty() => *text.last_mut().unwrap() = safe,
                1 if at < text.len() => text[at] = safe,
                2 => text.insert(at, safe),
                3 if at < text.len() => {
                    text.remove(at);
                }
                4 => text.push('='),
                _ => text.insert(
                    at,
                    *g.choose(&['+', '/', '=', ' ', '.', '\n', 'é']).unwrap(),
                ),
            }
        }
        TokenText(text.into_iter().collect())
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = TokenText>> {
        Box::new(self.0.shrink().map(TokenText))
    }
}

// ---------------------------------------------------------------- the model

/// The naive model of a vector: nonzero entries by stream.
type Model = BTreeMap<u64, u64>;

fn model_of(vector: &VersionVector) -> Model {
    vector
        .iter()
        .map(|(stream, seq)| (stream.get(), seq))
        .collect()
}

fn model_get(model: &Model, stream: u64) -> u64 {
    model.get(&stream).copied().unwrap_or(0)
}

/// Whether `a` covers everything `b` covers.
fn model_dominates(a: &Model, b: &Model) -> bool {
    b.iter().all(|(&stream, &seq)| model_get(a, stream) >= seq)
}

fn model_join(a: &Model, b: &Model) -> Model {
    let mut out = a.clone();
    for (&stream, &seq) in b {
        let entry = out.entry(stream).or_insert(0);
        *entry = (*entry).max(seq);
    }
    out
}

fn varint_len(value: u64) -> usize {
    // One byte per started group of 7 bits; 0 takes one byte.
    (64 - value.leading_zeros() as usize).max(1).div_ceil(7)
}

/// The size formula of `docs/TOKEN.md`:
/// 1 + varint_len(n) + Σ(varint_len(gap_i) + varint_len(seq_i)) + 4.
fn model_token_len(model: &Model) -> usize {
    let mut len = 1 + varint_len(model.len() as u64) + 4;
    let mut next = 0u64;
    for (&stream, &seq) in model {
        len += varint_len(stream - next) + varint_len(seq);
        next = stream.wrapping_add(1);
    }
    len
}

// ---------------------------------------------------------------- properties

#[test]
fn vectors_match_the_model() {
    fn property(entries: Entries) -> Result<(), String> {
        let vector = entries.vector();
        let model = entries.model();
        if model_of(&vector) != model {
            return Err(format!("vector {vector:?}, model {model:?}"));
        }
        if vector.len() != model.len() || vector.is_empty() != model.is_empty() {
            return Err(format!(
                "len {} is_empty {}",
                vector.len(),
                vector.is_empty()
            ));
        }
        for &(stream, _) in &entries.0 {
            let want = model_get(&model, stream);
            let id = StreamId::new(stream);
            let got = vector.get(id);
            // Covered: every seq up to the entry, and nothing above it.
            let covers_above = want < u64::MAX && vector.covers(id, want + 1);
            if got != want || !vector.covers(id, want) || covers_above {
                return Err(format!("stream {stream:x}: get {got}, model {want}"));
            }
        }
        let total: u128 = model.values().map(|&seq| u128::from(seq)).sum();
        if vector.total() != total {
            return Err(format!("total {} want {total}", vector.total()));
        }
        Ok(())
    }
    check(
        "vectors_match_the_model",
        300,
        property as fn(Entries) -> Result<(), String>,
    );
}

#[test]
fn tokens_round_trip_with_the_documented_size() {
    fn property(entries: Entries) -> Result<(), String> {
        let vector = entries.vector();
        let bytes = token::encode(&vector).map_err(|e| format!("encode: {e}"))?;
        let decoded = token::decode(&bytes);
        if decoded.as_ref() != Ok(&vector) {
            return Err(format!("decode(encode(v)) = {decoded:?}"));
        }
        let text = token::encode_text(&vector).map_err(|e| format!("encode_text: {e}"))?;
        let decoded = token::decode_text(&text);
        if decoded.as_ref() != Ok(&vector) {
            return Err(format!("decode_text(encode_text(v)) = {decoded:?}"));
        }
        if text != URL_SAFE_NO_PAD.encode(&bytes) {
            return Err(format!("text {text} is not the base64 of the bytes"));
        }
        let want = model_token_len(&entries.model());
        if bytes.len() != want {
            return Err(format!("{} bytes; the formula says {want}", bytes.len()));
        }
        if bytes.len() > token::TOKEN_BYTES_MAX || text.len() != (bytes.len() * 4).div_ceil(3) {
            return Err(format!("{} bytes, {} chars", bytes.len(), text.len()));
        }
        Ok(())
    }
    check(
        "tokens_round_trip_with_the_documented_size",
        300,
        property as fn(Entries) -> Result<(), String>,
    );
}

#[test]
fn decoded_bytes_are_canonical() {
    static DECODED: AtomicU64 = AtomicU64::new(0);
    static REFUSED_INSIDE: AtomicU64 = AtomicU64::new(0);
    fn property(input: TokenBytes) -> Result<(), String> {
        let bytes = input.bytes();
        let decoded = token::decode(&bytes);
        // The text path decodes the same bytes to the same answer.
        let text = URL_SAFE_NO_PAD.encode(&bytes);
        let decoded_text = token::decode_text(&text);
        if decoded_text != decoded {
            return Err(format!("decode {decoded:?}, decode_text {decoded_text:?}"));
        }
        match decoded {
            Ok(vector) => {
                DECODED.fetch_add(1, Relaxed);
                let encoded = token::encode(&vector).map_err(|e| format!("encode: {e}"))?;
                if encoded != bytes {
                    return Err(format!(
                        "{vector:?} decoded from {bytes:02x?} re-encodes as {encoded:02x?}"
                    ));
                }
                if token::encode_text(&vector).as_ref() != Ok(&text) {
                    return Err(format!("{vector:?}: text {text} is not canonical"));
                }
            }
            Err(error) => {
                // A framed input has a right header and checksum: it must be
                // refused for what is inside.
                if let TokenBytes::Framed(_) = input {
                    REFUSED_INSIDE.fetch_add(1, Relaxed);
                    if matches!(
                        error,
                        TokenError::UnknownVersion { .. }
                            | TokenError::ChecksumMismatch { .. }
                            | TokenError::TooLarge { .. }
                    ) {
                        return Err(format!("framed input refused at the frame: {error:?}"));
                    }
                }
            }
        }
        Ok(())
    }
    let name = "decoded_bytes_are_canonical";
    check(name, 2000, property as fn(TokenBytes) -> Result<(), String>);
    assert_seen(name, "a token that decodes", &DECODED);
    assert_seen(name, "a framed token refused inside", &REFUSED_INSIDE);
}

#[test]
fn decoded_text_is_canonical() {
    static DECODED: AtomicU64 = AtomicU64::new(0);
    static REFUSED_BASE64: AtomicU64 = AtomicU64::new(0);
    fn property(input: TokenText) -> Result<(), String> {
        let text = input.0;
        match token::decode_text(&text) {
            Ok(vector) => {
                DECODED.fetch_add(1, Relaxed);
                let encoded = token::encode_text(&vector);
                if encoded.as_ref() != Ok(&text) {
                    return Err(format!(
                        "{vector:?} decoded from {text:?} re-encodes as {encoded:?}"
                    ));
                }
            }
            Err(TokenError::Base64 { offset, .. }) => {
                REFUSED_BASE64.fetch_add(1, Relaxed);
                if offset > text.len() {
                    return Err(format!("offset {offset} past the text's end"));
                }
            }
            Err(_) => {}
        }
        Ok(())
    }
    let name = "decoded_text_is_canonical";
    check(name, 1500, property as fn(TokenText) -> Result<(), String>);
    assert_seen(name, "a text token that decodes", &DECODED);
    assert_seen(name, "a text refused as base64", &REFUSED_BASE64);
}

#[test]
fn join_is_a_semilattice() {
    fn property(a: Entries, b: Entries, c: Entries) -> Result<(), String> {
        let (a_model, b_model, c_model) = (a.model(), b.model(), c.model());
        let (a, b, c) = (a.vector(), b.vector(), c.vector());
        let ab = a.joined(&b);
        if model_of(&ab) != model_join(&a_model, &b_model) {
            return Err(format!(
                "{a:?} ⊔ {b:?} = {ab:?}, not the per-stream maximum"
            ));
        }
        if ab != b.joined(&a) {
            return Err(format!("not commutative: {a:?}, {b:?}"));
        }
        if ab.joined(&c) != a.joined(&b.joined(&c)) {
            return Err(format!("not associative: {a:?}, {b:?}, {c:?}"));
        }
        if a.joined(&a) != a || ab.joined(&b) != ab {
            return Err(format!("not idempotent: {a:?}, {b:?}"));
        }
        let mut in_place = a.clone();
        in_place.join(&b);
        if in_place != ab {
            return Err(format!("join {in_place:?} differs from joined {ab:?}"));
        }
        if !ab.dominates(&a) || !ab.dominates(&b) {
            return Err(format!("{ab:?} does not dominate its parts"));
        }
        // The model of the three-way join, against the vector's.
        let abc = model_join(&model_join(&a_model, &b_model), &c_model);
        if model_of(&ab.joined(&c)) != abc {
            return Err(format!("three-way join differs from the model {abc:?}"));
        }
        Ok(())
    }
    check(
        "join_is_a_semilattice",
        300,
        property as fn(Entries, Entries, Entries) -> Result<(), String>,
    );
}

#[test]
fn order_agrees_with_the_model() {
    // Less, Equal, Greater, concurrent.
    static SEEN: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
    fn property(pair: Pair) -> Result<(), String> {
        let (a_model, b_model) = (pair.0.model(), pair.1.model());
        let (a, b) = (pair.0.vector(), pair.1.vector());
        let a_ge_b = model_dominates(&a_model, &b_model);
        let b_ge_a = model_dominates(&b_model, &a_model);
        let want = match (a_ge_b, b_ge_a) {
            (true, true) => Some(Ordering::Equal),
            (true, false) => Some(Ordering::Greater),
            (false, true) => Some(Ordering::Less),
            (false, false) => None,
        };
        SEEN[match want {
            Some(Ordering::Less) => 0,
            Some(Ordering::Equal) => 1,
            Some(Ordering::Greater) => 2,
            None => 3,
        }]
        .fetch_add(1, Relaxed);
        let got = a.partial_cmp(&b);
        let checks = [
            ("partial_cmp", got == want),
            (
                "reverse partial_cmp",
                b.partial_cmp(&a) == want.map(Ordering::reverse),
            ),
            ("a.dominates(b)", a.dominates(&b) == a_ge_b),
            ("b.dominates(a)", b.dominates(&a) == b_ge_a),
            ("a >= b", (a >= b) == a_ge_b),
            ("a <= b", (a <= b) == b_ge_a),
            ("a.concurrent(b)", a.concurrent(&b) == (!a_ge_b && !b_ge_a)),
            ("b.concurrent(a)", b.concurrent(&a) == (!a_ge_b && !b_ge_a)),
            ("a == b", (a == b) == (a_model == b_model)),
        ];
        match checks.iter().find(|(_, ok)| !ok) {
            Some((what, _)) => Err(format!(
                "{what} disagrees with the model: {a:?} vs {b:?}, partial_cmp {got:?}, model {want:?}"
            )),
            None => Ok(()),
        }
    }
    let name = "order_agrees_with_the_model";
    check(name, 500, property as fn(Pair) -> Result<(), String>);
    for (counter, what) in SEEN.iter().zip(["Less", "Equal", "Greater", "concurrent"]) {
        assert_seen(name, what, counter);
    }
}

/// Regression, found by `check_floor_agrees_with_the_model` (shrunk to an
/// empty cursor and a floor of seq u64::MAX, whose resume cursor is then
/// checked against that floor): `check_floor` computed `cursor_seq + 1` for
/// every floor stream, also where the cursor is not below the floor, so a
/// cursor at seq u64::MAX on a floor stream overflowed, which panics in a
/// debug build. A cursor comes from a stranger's token: any seq is possible.
#[test]
fn check_floor_with_a_cursor_at_the_largest_seq_does_not_overflow() {
    let stream = StreamId::new(0);
    let cursor: VersionVector = [(stream, u64::MAX)].into_iter().collect();
    for floor_seq in [1, u64::MAX - 1, u64::MAX] {
        let floor: VersionVector = [(stream, floor_seq)].into_iter().collect();
        assert_eq!(cursor.check_floor(&floor), Ok(()), "floor seq {floor_seq}");
    }
}

#[test]
fn check_floor_agrees_with_the_model() {
    static STALE: AtomicU64 = AtomicU64::new(0);
    static FRESH: AtomicU64 = AtomicU64::new(0);
    fn property(pair: Pair) -> Result<(), String> {
        let (cursor_model, floor_model) = (pair.0.model(), pair.1.model());
        let (cursor, floor) = (pair.0.vector(), pair.1.vector());
        // Lost: every floor stream the cursor is below, cursor+1 ..= floor.
        let want_lost: Vec<(u64, u64, u64)> = floor_model
            .iter()
            .filter(|&(&stream, &floor_seq)| model_get(&cursor_model, stream) < floor_seq)
            .map(|(&stream, &floor_seq)| (stream, model_get(&cursor_model, stream) + 1, floor_seq))
            .collect();
        match cursor.check_floor(&floor) {
            Ok(()) => {
                FRESH.fetch_add(1, Relaxed);
                if !want_lost.is_empty() {
                    return Err(format!(
                        "{cursor:?} passed floor {floor:?}; the model loses {want_lost:x?}"
                    ));
                }
            }
            Err(stale) => {
                STALE.fetch_add(1, Relaxed);
                let lost: Vec<(u64, u64, u64)> = stale
                    .lost()
                    .iter()
                    .map(|range| (range.stream.get(), range.first_seq, range.last_seq))
                    .collect();
                if lost != want_lost {
                    return Err(format!("lost {lost:x?}, model {want_lost:x?}"));
                }
                for range in stale.lost() {
                    if range.seqs() != (range.first_seq..=range.last_seq)
                        || u128::from(range.count())
                            != u128::from(range.last_seq) - u128::from(range.first_seq) + 1
                    {
                        return Err(format!("range {range:?} is inconsistent"));
                    }
                }
                let want_count: u128 = want_lost
                    .iter()
                    .map(|&(_, first, last)| u128::from(last - first) + 1)
                    .sum();
                if stale.lost_count() != want_count {
                    return Err(format!(
                        "lost_count {} want {want_count}",
                        stale.lost_count()
                    ));
                }
                let resume = stale.resume();
                if model_of(resume) != model_join(&cursor_model, &floor_model) {
                    return Err(format!("resume {resume:?} is not cursor ⊔ floor"));
                }
                if let Err(again) = resume.check_floor(&floor) {
                    return Err(format!("resume {resume:?} is stale again: {again}"));
                }
                // The message names the first streams and their ranges.
                let message = stale.to_string();
                for &(stream, first, last) in want_lost.iter().take(16) {
                    let named = format!("stream {stream:x} seq {first}..={last};");
                    if !message.contains(&named) {
                        return Err(format!("message {message:?} does not name {named:?}"));
                    }
                }
            }
        }
        Ok(())
    }
    let name = "check_floor_agrees_with_the_model";
    check(name, 500, property as fn(Pair) -> Result<(), String>);
    assert_seen(name, "a stale cursor", &STALE);
    assert_seen(name, "a cursor at or above the floor", &FRESH);
}

// ---------------------------------------------------------------- version 2

/// The model's differences of `cursor` from `checkpoint`: per stream where
/// they differ, `cursor - checkpoint` (as an i128: it may not fit an i64).
fn model_differences(checkpoint: &Model, cursor: &Model) -> Vec<(u64, i128)> {
    let streams: std::collections::BTreeSet<u64> =
        checkpoint.keys().chain(cursor.keys()).copied().collect();
    streams
        .into_iter()
        .map(|s| {
            (
                s,
                i128::from(model_get(cursor, s)) - i128::from(model_get(checkpoint, s)),
            )
        })
        .filter(|&(_, d)| d != 0)
        .collect()
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

/// The version-2 size formula of `docs/TOKEN.md`:
/// 1 + 16 + varint_len(n) + Σ(varint_len(gap_i) + varint_len(zigzag(d_i))) + 4.
fn model_relative_len(differences: &[(u64, i64)]) -> usize {
    let mut len = 1 + 16 + varint_len(differences.len() as u64) + 4;
    let mut next = 0u64;
    for &(stream, d) in differences {
        len += varint_len(stream - next) + varint_len(zigzag(d));
        next = stream.wrapping_add(1);
    }
    len
}

/// A checkpoint and a cursor for version 2: a [`Pair`] most often, and one
/// time in eight a cursor that differs from its checkpoint on 127 to 130
/// streams, on both sides of the limit of 128 (a [`Pair`] alone rarely gets there).
#[derive(Clone, Debug)]
struct RelativePair(Pair);

impl Arbitrary for RelativePair {
    fn arbitrary(g: &mut Gen) -> RelativePair {
        if below(g, 8) != 0 {
            return RelativePair(Pair::arbitrary(g));
        }
        // Distinct ids, dense to spread over the whole id space.
        let spread = 1 + below(g, u64::MAX / 140);
        let streams: Vec<u64> = (0..127 + below(g, 4)).map(|i| i * spread).collect();
        let checkpoint: Vec<(u64, u64)> =
            streams.iter().map(|&s| (s, 1 + below(g, 1000))).collect();
        let cursor = checkpoint.iter().map(|&(s, seq)| (s, seq + 1)).collect();
        RelativePair(Pair(Entries(checkpoint), Entries(cursor)))
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = RelativePair>> {
        Box::new(self.0.shrink().map(RelativePair))
    }
}

#[test]
fn relative_tokens_round_trip_or_are_refused_as_the_model_says() {
    static ENCODED: AtomicU64 = AtomicU64::new(0);
    static TOO_MANY: AtomicU64 = AtomicU64::new(0);
    static OUT_OF_RANGE: AtomicU64 = AtomicU64::new(0);
    fn property(RelativePair(pair): RelativePair) -> Result<(), String> {
        let (checkpoint, cursor) = (pair.0.vector(), pair.1.vector());
        let differences = model_differences(&pair.0.model(), &pair.1.model());
        let checkpoint = Checkpoint::new(checkpoint).map_err(|e| e.to_string())?;
        let encoded = token::encode_relative(&cursor, &checkpoint);
        if differences.len() > CHECKPOINT_DIFF_MAX {
            TOO_MANY.fetch_add(1, Relaxed);
            let want = TokenError::TooManyDifferences {
                differences: differences.len(),
                limit: CHECKPOINT_DIFF_MAX,
            };
            return match encoded {
                Err(error) if error == want => Ok(()),
                other => Err(format!("{other:?}, want {want:?}")),
            };
        }
        let fits: Option<Vec<(u64, i64)>> = differences
            .iter()
            .map(|&(s, d)| i64::try_from(d).ok().map(|d| (s, d)))
            .collect();
        let Some(fits) = fits else {
            OUT_OF_RANGE.fetch_add(1, Relaxed);
            return match encoded {
                Err(TokenError::DifferenceOutOfRange { .. }) => Ok(()),
                other => Err(format!("{other:?}, want DifferenceOutOfRange")),
            };
        };
        ENCODED.fetch_add(1, Relaxed);
        let bytes = encoded.map_err(|e| format!("encode_relative: {e}"))?;
        if bytes.len() != model_relative_len(&fits) {
            return Err(format!(
                "{} bytes, the formula says {}",
                bytes.len(),
                model_relative_len(&fits)
            ));
        }
        let text = token::encode_relative_text(&cursor, &checkpoint).map_err(|e| e.to_string())?;
        for decoded in [token::decode_any(&bytes), token::decode_any_text(&text)] {
            let Ok(Token::Relative(relative)) = decoded else {
                return Err(format!("decode_any: {decoded:?}"));
            };
            let got: Vec<(u64, i64)> = relative
                .differences()
                .iter()
                .map(|&(s, d)| (s.get(), d))
                .collect();
            if got != fits || relative.checkpoint() != checkpoint.name() {
                return Err(format!("decoded {relative:?}, model {fits:?}"));
            }
            let expanded = relative.expand(&checkpoint);
            if expanded.as_ref() != Ok(&cursor) {
                return Err(format!("expands to {expanded:?}, want {cursor:?}"));
            }
        }
        Ok(())
    }
    let name = "relative_tokens_round_trip_or_are_refused_as_the_model_says";
    check(
        name,
        500,
        property as fn(RelativePair) -> Result<(), String>,
    );
    assert_seen(name, "a cursor that encodes as version 2", &ENCODED);
    assert_seen(name, "a cursor of too many differences", &TOO_MANY);
    assert_seen(name, "a difference past an i64", &OUT_OF_RANGE);
}

/// Bytes for `decode_any`'s version 2, with the checkpoint they may name:
/// arbitrary bytes after a `02`, or a body (random, or a real token's body
/// edited) between the version byte and the checkpoint's name and a valid
/// checksum, so most inputs reach the differences and the expansion.
#[derive(Clone, Debug)]
struct RelativeBytes {
    checkpoint: Entries,
    bytes: Vec<u8>,
}

impl Arbitrary for RelativeBytes {
    fn arbitrary(g: &mut Gen) -> RelativeBytes {
        let Pair(checkpoint, cursor) = Pair::arbitrary(g);
        let named = Checkpoint::new(checkpoint.vector()).expect("within STREAMS_MAX");
        let body: Vec<u8> = match below(g, 4) {
            0 => {
                let mut bytes = vec![token::TOKEN_VERSION_RELATIVE];
                bytes.extend(Vec::<u8>::arbitrary(g));
                return RelativeBytes { checkpoint, bytes };
            }
            1 => (0..below(g, 24)).map(|_| edge_byte(g)).collect(),
            _ => {
                let Ok(token) = token::encode_relative(&cursor.vector(), &named) else {
                    return RelativeBytes::arbitrary(g);
                };
                let mut body = token[17..token.len() - 4].to_vec();
                for _ in 0..below(g, 3) {
                    let at = below(g, body.len() as u64 + 1) as usize;
                    match below(g, 5) {
                        0 if at < body.len() => body[at] ^= 1 << below(g, 8),
                        1 if at < body.len() => body[at] = edge_byte(g),
                        2 => body.insert(at, edge_byte(g)),
                        3 => body.truncate(at),
                        _ => body.push(edge_byte(g)),
                    }
                }
                body
            }
        };
        let mut bytes = vec![token::TOKEN_VERSION_RELATIVE];
        bytes.extend_from_slice(named.name().as_bytes());
        bytes.extend(body);
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        RelativeBytes { checkpoint, bytes }
    }
}

#[test]
fn decoded_relative_bytes_are_canonical_and_expand_as_the_model_says() {
    static EXPANDED: AtomicU64 = AtomicU64::new(0);
    static REFUSED: AtomicU64 = AtomicU64::new(0);
    fn property(input: RelativeBytes) -> Result<(), String> {
        let bytes = &input.bytes;
        let decoded = token::decode_any(bytes);
        let text = token::decode_any_text(&URL_SAFE_NO_PAD.encode(bytes));
        if text != decoded {
            return Err(format!("decode_any {decoded:?}, its text {text:?}"));
        }
        let relative = match decoded {
            Ok(Token::Relative(relative)) => relative,
            Ok(Token::Absolute(vector)) => return Err(format!("version 2 read as {vector:?}")),
            Err(_) => return Ok(()),
        };
        let again = Token::Relative(relative.clone()).encode();
        if again.as_ref() != Ok(bytes) {
            return Err(format!(
                "{relative:?} from {bytes:02x?} re-encodes as {again:02x?}"
            ));
        }
        let checkpoint = Checkpoint::new(input.checkpoint.vector()).map_err(|e| e.to_string())?;
        let other = Checkpoint::new(VersionVector::new()).map_err(|e| e.to_string())?;
        if other.name() != checkpoint.name() && relative.expand(&other).is_ok() {
            return Err("expanded against a checkpoint of another name".to_owned());
        }
        if relative.checkpoint() != checkpoint.name() {
            return Ok(()); // a raw input: its name is arbitrary
        }
        let mut model = input.checkpoint.model();
        let mut overflow = false;
        for &(stream, d) in relative.differences() {
            let base = model_get(&model, stream.get());
            match base.checked_add_signed(d) {
                Some(0) => drop(model.remove(&stream.get())),
                Some(seq) => drop(model.insert(stream.get(), seq)),
                None => overflow = true,
            }
        }
        match relative.expand(&checkpoint) {
            Ok(vector) if !overflow && model_of(&vector) == model => {
                EXPANDED.fetch_add(1, Relaxed);
                let again = token::encode_relative(&vector, &checkpoint);
                if again.as_ref() != Ok(bytes) {
                    return Err(format!("expanded {vector:?} re-encodes as {again:02x?}"));
                }
                Ok(())
            }
            Err(TokenError::SeqOutOfRange { .. }) if overflow => {
                REFUSED.fetch_add(1, Relaxed);
                Ok(())
            }
            other => Err(format!(
                "expand: {other:?}, model {model:?} overflow {overflow}"
            )),
        }
    }
    let name = "decoded_relative_bytes_are_canonical_and_expand_as_the_model_says";
    check(
        name,
        2000,
        property as fn(RelativeBytes) -> Result<(), String>,
    );
    assert_seen(name, "a token that expands", &EXPANDED);
    assert_seen(name, "a difference past a seq", &REFUSED);
}

/// Every version-1 input, valid or not, gets from `decode_any` exactly what
/// `decode` answers: version 1 is read as it always was.
#[test]
fn decode_any_reads_version_1_exactly_as_decode() {
    fn property(input: TokenBytes) -> Result<(), String> {
        let bytes = input.bytes();
        if bytes.first() == Some(&token::TOKEN_VERSION_RELATIVE) {
            return Ok(());
        }
        let any = token::decode_any(&bytes);
        let one = token::decode(&bytes).map(Token::Absolute);
        if any != one {
            return Err(format!("decode_any {any:?}, decode {one:?}"));
        }
        Ok(())
    }
    check(
        "decode_any_reads_version_1_exactly_as_decode",
        1000,
        property as fn(TokenBytes) -> Result<(), String>,
    );
}
