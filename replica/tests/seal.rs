//! Writer keys, seals and signed statements (`docs/SIGNING.md`): what a
//! relay or a stranger can do with their bytes, and what it cannot.
//!
//! Round trips of every encoding; every byte of an encoding flipped is
//! refused (never accepted, never a panic); a key that does not derive the
//! seal's stream is refused unless a binding names it; a batch with one bad
//! seal among many names that seal; statements signed by the wrong key are
//! refused; and fixed vectors (a key from fixed bytes, its stream id, a
//! seal's and a statement's bytes) so that the formats cannot drift
//! silently. Seeded: `MESHLOG_SEED=<n>` replays a failing run.

use curve25519_dalek::constants::EIGHT_TORSION;
use meshlog_cursor::StreamId;
use meshlog_replica::{
    verify_seals, AdminKey, AdminPublicKey, Binding, ChainHash, Compaction, CompactionSigner,
    Event, KeyFault, Seal, SealError, SignedAdmission, SignedBinding, SignedCompaction,
    WriterAdmission, WriterKey, WriterPublicKey,
};
use meshlog_testkit::seed::{self, for_each_seed, with_seed};
use meshlog_testkit::SplitMix64;

fn key(rng: &mut SplitMix64) -> WriterKey {
    WriterKey::from_bytes(rng.bytes())
}

fn admin_key(rng: &mut SplitMix64) -> AdminKey {
    AdminKey::from_bytes(key(rng).to_bytes())
}

fn hash(rng: &mut SplitMix64) -> ChainHash {
    ChainHash::from_bytes(rng.bytes())
}

/// A writer's chain of `len` events and the seal at its end.
fn sealed_chain(key: &WriterKey, len: u64) -> (Vec<Event>, Seal) {
    let events: Vec<Event> = (1..=len)
        .map(|seq| Event {
            stream: key.stream(),
            seq,
            lamport: seq * 2,
            time_ms: 1_000 + seq,
            payload: format!("event {seq}").into_bytes().into(),
        })
        .collect();
    let head = ChainHash::GENESIS.extend(&events);
    (events, Seal::sign(key, len, head))
}

/// A nonzero byte to xor into a byte, so that it changes.
fn flip(rng: &mut SplitMix64) -> u8 {
    (rng.next_u64() % 255) as u8 + 1
}

#[test]
fn every_encoding_round_trips() {
    for_each_seed("every_encoding_round_trips", 0x5ea1_0001, 16, |seed| {
        let mut rng = SplitMix64::new(seed);
        let writer = key(&mut rng);
        let admin = admin_key(&mut rng);
        assert_eq!(
            WriterKey::from_bytes(writer.to_bytes()).public(),
            writer.public()
        );
        let public = writer.public();
        assert_eq!(WriterPublicKey::from_bytes(&public.to_bytes()), Ok(public));
        assert_eq!(
            AdminPublicKey::from_bytes(&admin.public().to_bytes()),
            Ok(admin.public())
        );

        let seal = Seal::sign(&writer, rng.next_u64(), hash(&mut rng));
        assert_eq!(Seal::from_bytes(&seal.to_bytes()), Ok(seal));
        assert_eq!(seal.verify(&public), Ok(()));

        let compaction = Compaction {
            stream: writer.stream(),
            floor: rng.next_u64(),
            hash: hash(&mut rng),
        };
        for signed in [
            compaction.sign_by_writer(&writer),
            compaction.sign_by_admin(&admin),
        ] {
            assert_eq!(SignedCompaction::from_bytes(&signed.to_bytes()), Ok(signed));
        }
        let admission = WriterAdmission { key: public }.sign(&admin);
        assert_eq!(
            SignedAdmission::from_bytes(&admission.to_bytes()),
            Ok(admission)
        );
        assert_eq!(admission.verify(&admin.public()).map(|a| a.key), Ok(public));
        let binding = Binding {
            stream: StreamId::new(rng.next_u64()),
            key: public,
        }
        .sign(&admin);
        assert_eq!(SignedBinding::from_bytes(&binding.to_bytes()), Ok(binding));
        assert_eq!(binding.verify(&admin.public()), Ok(binding.statement));
    });
}

/// Every length but the one an encoding has is refused by its length,
/// whatever the bytes.
#[test]
fn every_other_length_is_refused_by_its_length() {
    let bytes = [0u8; 300];
    for len in 0..bytes.len() {
        let input = &bytes[..len];
        let checks: [(usize, Option<SealError>); 5] = [
            (32, WriterPublicKey::from_bytes(input).err()),
            (Seal::LEN, Seal::from_bytes(input).err()),
            (
                SignedCompaction::LEN,
                SignedCompaction::from_bytes(input).err(),
            ),
            (
                SignedAdmission::LEN,
                SignedAdmission::from_bytes(input).err(),
            ),
            (SignedBinding::LEN, SignedBinding::from_bytes(input).err()),
        ];
        for (expected, error) in checks {
            if len != expected {
                assert!(
                    matches!(error, Some(SealError::WrongLength { expected: e, got, .. }) if e == expected && got == len),
                    "length {len}: {error:?}"
                );
            }
        }
    }
}

/// A relay that changes any byte of a seal, of the key it is checked
/// under, or of the events below it is refused.
#[test]
fn every_byte_flipped_in_a_seal_its_key_or_its_events_is_refused() {
    for_each_seed("every_byte_flipped_in_a_seal", 0x5ea1_0002, 4, |seed| {
        let mut rng = SplitMix64::new(seed);
        let writer = key(&mut rng);
        let (events, seal) = sealed_chain(&writer, 3);
        let public = writer.public();
        seal.verify(&public).unwrap();

        let bytes = seal.to_bytes();
        for at in 0..bytes.len() {
            let mut changed = bytes;
            changed[at] ^= flip(&mut rng);
            let refused = Seal::from_bytes(&changed).unwrap().verify(&public);
            let expected = if at < 8 {
                "KeyMismatch"
            } else {
                "BadSignature"
            };
            assert!(
                format!("{refused:?}").contains(expected),
                "seal byte {at}: {refused:?}, seed {seed}"
            );
        }

        let key_bytes = public.to_bytes();
        for at in 0..key_bytes.len() {
            let mut changed = key_bytes;
            changed[at] ^= flip(&mut rng);
            match WriterPublicKey::from_bytes(&changed) {
                Err(SealError::BadKey { .. }) => {}
                Err(other) => panic!("key byte {at}: {other:?}, seed {seed}"),
                Ok(other) => assert!(
                    matches!(seal.verify(&other), Err(SealError::KeyMismatch { .. })),
                    "key byte {at} verified, seed {seed}"
                ),
            }
        }

        // A changed event below the seal changes the head the seal signs,
        // whichever field or payload byte it is.
        for (i, _) in events.iter().enumerate() {
            for field in 0..4 {
                let mut changed = events.clone();
                let e = &mut changed[i];
                match field {
                    0 => e.lamport ^= 1,
                    1 => e.time_ms ^= 1 << (rng.next_u64() % 64),
                    2 => {
                        let mut payload = e.payload.to_vec();
                        let at = (rng.next_u64() as usize) % payload.len();
                        payload[at] ^= flip(&mut rng);
                        e.payload = payload.into();
                    }
                    _ => e.payload = e.payload.slice(1..),
                }
                let head = ChainHash::GENESIS.extend(&changed);
                let forged = Seal { head, ..seal };
                assert_eq!(
                    forged.verify(&public),
                    Err(SealError::BadSignature {
                        stream: writer.stream(),
                        seq: 3
                    }),
                    "event {i} field {field}, seed {seed}"
                );
            }
        }
    });
}

#[test]
fn every_byte_flipped_in_a_statement_is_refused() {
    for_each_seed(
        "every_byte_flipped_in_a_statement",
        0x5ea1_0003,
        4,
        |seed| {
            let mut rng = SplitMix64::new(seed);
            let writer = key(&mut rng);
            let admin = admin_key(&mut rng);
            let compaction = Compaction {
                stream: writer.stream(),
                floor: 9,
                hash: hash(&mut rng),
            };
            for signed in [
                compaction.sign_by_writer(&writer),
                compaction.sign_by_admin(&admin),
            ] {
                let bytes = signed.to_bytes();
                for at in 0..bytes.len() {
                    let mut changed = bytes;
                    changed[at] ^= flip(&mut rng);
                    if let Ok(decoded) = SignedCompaction::from_bytes(&changed) {
                        let verdict = decoded.verify(Some(&admin.public()), None);
                        assert!(verdict.is_err(), "compaction byte {at}, seed {seed}");
                    }
                }
            }
            let admission = WriterAdmission {
                key: writer.public(),
            }
            .sign(&admin);
            let bytes = admission.to_bytes();
            for at in 0..bytes.len() {
                let mut changed = bytes;
                changed[at] ^= flip(&mut rng);
                if let Ok(decoded) = SignedAdmission::from_bytes(&changed) {
                    assert!(
                        decoded.verify(&admin.public()).is_err(),
                        "admission byte {at}, seed {seed}"
                    );
                }
            }
            let binding = Binding {
                stream: StreamId::new(77),
                key: writer.public(),
            }
            .sign(&admin);
            let bytes = binding.to_bytes();
            for at in 0..bytes.len() {
                let mut changed = bytes;
                changed[at] ^= flip(&mut rng);
                if let Ok(decoded) = SignedBinding::from_bytes(&changed) {
                    assert!(
                        decoded.verify(&admin.public()).is_err(),
                        "binding byte {at}, seed {seed}"
                    );
                }
            }
        },
    );
}

/// A writer's key signs only for the stream it derives: a seal it makes
/// for another stream is refused, naming both, unless a trusted binding
/// names the key for that (legacy) stream.
#[test]
fn a_key_that_does_not_derive_the_stream_is_refused_unless_bound() {
    let mut rng = SplitMix64::new(seed::replay_or(0x5ea1_0004));
    let writer = key(&mut rng);
    let legacy = StreamId::new(0x001e_9ac7);
    let seal = Seal::sign_for(&writer, legacy, 4, hash(&mut rng));
    assert_eq!(
        seal.verify(&writer.public()),
        Err(SealError::KeyMismatch {
            stream: legacy,
            derived: writer.stream()
        })
    );
    let binding = Binding {
        stream: legacy,
        key: writer.public(),
    };
    assert_eq!(seal.verify_bound(&writer.public(), Some(&binding)), Ok(()));
    // A binding of another stream, or of another key, binds nothing here.
    let other_stream = Binding {
        stream: StreamId::new(5),
        ..binding
    };
    let other_key = Binding {
        key: key(&mut rng).public(),
        ..binding
    };
    for wrong in [other_stream, other_key] {
        assert!(matches!(
            seal.verify_bound(&writer.public(), Some(&wrong)),
            Err(SealError::KeyMismatch { .. })
        ));
    }
    // The batch looks bindings up by stream.
    assert!(matches!(
        verify_seals(&[(seal, writer.public())], &[]),
        Err(SealError::KeyMismatch { .. })
    ));
    assert_eq!(verify_seals(&[(seal, writer.public())], &[binding]), Ok(()));
    // Whatever other bindings of the stream come before it.
    assert_eq!(
        verify_seals(&[(seal, writer.public())], &[other_key, binding]),
        Ok(())
    );
}

/// One bad seal among many fails the batch, and the one-by-one fallback
/// names it: its stream and seq, whichever it is.
#[test]
fn a_batch_with_one_bad_seal_names_that_seal() {
    for_each_seed(
        "a_batch_with_one_bad_seal_names_that_seal",
        0x5ea1_0005,
        8,
        |seed| {
            let mut rng = SplitMix64::new(seed);
            let writers: Vec<WriterKey> = (0..8).map(|_| key(&mut rng)).collect();
            let len = 1 + (rng.next_u64() % 64) as usize;
            let mut seals: Vec<(Seal, WriterPublicKey)> = (0..len)
                .map(|i| {
                    let writer = &writers[i % writers.len()];
                    let seal = Seal::sign(writer, 1 + rng.next_u64() % 1000, hash(&mut rng));
                    (seal, writer.public())
                })
                .collect();
            assert_eq!(verify_seals(&seals, &[]), Ok(()), "seed {seed}");

            let bad = (rng.next_u64() as usize) % len;
            let (seal, _) = &mut seals[bad];
            match rng.next_u64() % 3 {
                0 => seal.signature[(rng.next_u64() % 64) as usize] ^= flip(&mut rng),
                1 => seal.seq ^= 1 << (rng.next_u64() % 64),
                _ => seal.head = hash(&mut rng),
            }
            let (stream, seq) = (seal.stream, seal.seq);
            assert_eq!(
                verify_seals(&seals, &[]),
                Err(SealError::BadSignature { stream, seq }),
                "bad seal {bad} of {len}, seed {seed}"
            );
        },
    );
}

/// Statements signed by a key without authority are refused: a
/// compaction by a stranger's key, an admission or a binding by another
/// admin, a compaction claiming the admin as signer that another key
/// signed. The writer and the admin have authority over a compaction.
#[test]
fn statements_signed_by_the_wrong_key_are_refused() {
    with_seed(
        "statements_signed_by_the_wrong_key_are_refused",
        seed::replay_or(0x5ea1_0006),
        |seed| {
            let mut rng = SplitMix64::new(seed);
            let writer = key(&mut rng);
            let stranger = key(&mut rng);
            let admin = admin_key(&mut rng);
            let other_admin = admin_key(&mut rng);
            let compaction = Compaction {
                stream: writer.stream(),
                floor: 12,
                hash: hash(&mut rng),
            };
            let trusted = Some(admin.public());

            assert_eq!(
                compaction
                    .sign_by_writer(&writer)
                    .verify(trusted.as_ref(), None),
                Ok(CompactionSigner::Writer)
            );
            assert_eq!(
                compaction.sign_by_writer(&writer).verify(None, None),
                Ok(CompactionSigner::Writer)
            );
            assert_eq!(
                compaction
                    .sign_by_admin(&admin)
                    .verify(trusted.as_ref(), None),
                Ok(CompactionSigner::Admin)
            );
            assert_eq!(
                compaction
                    .sign_by_writer(&stranger)
                    .verify(trusted.as_ref(), None),
                Err(SealError::NoAuthority {
                    stream: writer.stream(),
                    floor: 12,
                    derived: stranger.stream()
                })
            );
            // An admin the receiver does not trust is a stranger.
            assert!(matches!(
                compaction
                    .sign_by_admin(&other_admin)
                    .verify(trusted.as_ref(), None),
                Err(SealError::NoAuthority { .. })
            ));
            assert!(matches!(
                compaction.sign_by_admin(&admin).verify(None, None),
                Err(SealError::NoAuthority { .. })
            ));
            // Naming the admin as signer does not lend its authority.
            let mut forged = compaction.sign_by_writer(&stranger);
            forged.signer = WriterPublicKey::from_bytes(&admin.public().to_bytes()).unwrap();
            assert_eq!(
                forged.verify(trusted.as_ref(), None),
                Err(SealError::BadStatement {
                    statement: "compaction",
                    stream: Some(writer.stream())
                })
            );
            // A legacy stream's compaction by its bound writer.
            let legacy = Compaction {
                stream: StreamId::new(3),
                ..compaction
            };
            let binding = Binding {
                stream: legacy.stream,
                key: stranger.public(),
            };
            assert_eq!(
                legacy
                    .sign_by_writer(&stranger)
                    .verify(None, Some(&binding)),
                Ok(CompactionSigner::Writer)
            );

            let admission = WriterAdmission {
                key: writer.public(),
            };
            assert_eq!(
                admission.sign(&other_admin).verify(&admin.public()),
                Err(SealError::BadStatement {
                    statement: "admission",
                    stream: None
                })
            );
            assert_eq!(
                binding.sign(&other_admin).verify(&admin.public()),
                Err(SealError::BadStatement {
                    statement: "binding",
                    stream: Some(legacy.stream)
                })
            );
            // A signature of one kind is not a signature of another: the
            // admission's signature over the same key does not bind it.
            let admitted = admission.sign(&admin);
            let swapped = SignedBinding {
                statement: binding,
                signature: admitted.signature,
            };
            assert!(swapped.verify(&admin.public()).is_err());
        },
    );
}

/// A public key is a canonical encoding of a point of the prime-order
/// subgroup; anything else is refused by what is wrong with it.
#[test]
fn keys_that_are_not_usable_points_are_refused_by_their_fault() {
    let fault = |bytes: [u8; 32]| match WriterPublicKey::from_bytes(&bytes) {
        Err(SealError::BadKey { fault, .. }) => Some(fault),
        _ => None,
    };
    // y = 2 has no x on the curve.
    let mut not_a_point = [0u8; 32];
    not_a_point[0] = 2;
    assert_eq!(fault(not_a_point), Some(KeyFault::NotAPoint));
    // The identity (y = 1) is of small order; so is each torsion point.
    let mut identity = [0u8; 32];
    identity[0] = 1;
    assert_eq!(fault(identity), Some(KeyFault::SmallOrder));
    for point in EIGHT_TORSION {
        assert_eq!(
            fault(point.compress().to_bytes()),
            Some(KeyFault::SmallOrder)
        );
    }
    // y = p + 1 encodes the identity non-canonically.
    let mut non_canonical = [0xff; 32];
    non_canonical[0] = 0xee;
    non_canonical[31] = 0x7f;
    assert_eq!(fault(non_canonical), Some(KeyFault::NonCanonical));
    // A real key plus a point of order 8.
    let real = WriterKey::from_bytes([3; 32]).public().to_bytes();
    let point = curve25519_dalek::edwards::CompressedEdwardsY(real)
        .decompress()
        .unwrap();
    let mixed = (point + EIGHT_TORSION[1]).compress().to_bytes();
    assert_eq!(fault(mixed), Some(KeyFault::Torsion));
    // And a point of the prime-order subgroup is a key.
    assert!(WriterPublicKey::from_bytes(&real).is_ok());
}

#[test]
fn debug_never_prints_a_secret() {
    let secret = [0x5c; 32];
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let writer = WriterKey::from_bytes(secret);
    let admin = AdminKey::from_bytes(secret);
    for shown in [
        format!("{writer:?}"),
        format!("{writer:#?}"),
        format!("{admin:?}"),
    ] {
        assert!(!shown.contains(&hex), "{shown}");
        assert!(!shown.contains("92, 92, 92"), "{shown}");
    }
    assert!(format!("{writer:?}").contains(&writer.public().to_string()));
}

#[test]
fn generated_keys_differ_and_derive_their_stream() {
    let a = WriterKey::generate().unwrap();
    let b = WriterKey::generate().unwrap();
    assert_ne!(a.to_bytes(), b.to_bytes());
    assert_eq!(a.stream(), a.public().stream());
    let seal = Seal::sign(&a, 1, ChainHash::GENESIS);
    assert_eq!(seal.verify(&a.public()), Ok(()));
    assert!(matches!(
        seal.verify(&b.public()),
        Err(SealError::KeyMismatch { .. })
    ));
}

/// Fixed vectors: if one of these changes, every stored seal and every
/// stream id changes with it. Change them only with a format version.
#[test]
fn the_formats_match_their_fixed_vectors() {
    let secret: [u8; 32] = std::array::from_fn(|i| i as u8 + 1);
    let writer = WriterKey::from_bytes(secret);
    let public = writer.public();
    // The stream id is the documented formula.
    let derived = blake3::derive_key("meshlog stream id v1", &public.to_bytes());
    assert_eq!(
        writer.stream(),
        StreamId::new(u64::from_le_bytes(derived[..8].try_into().unwrap()))
    );
    let (_, seal) = sealed_chain(&writer, 3);
    let admin = AdminKey::from_bytes([0xad; 32]);
    let compaction = Compaction {
        stream: writer.stream(),
        floor: 2,
        hash: ChainHash::from_bytes([0x22; 32]),
    }
    .sign_by_admin(&admin);
    let seal_message = Seal::message(seal.stream, seal.seq, seal.head);
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(&seal_message[..15], b"meshlog seal v1");
    assert_eq!(hex(&public.to_bytes()), VECTOR_PUBLIC_KEY);
    assert_eq!(writer.stream().to_string(), VECTOR_STREAM);
    assert_eq!(hex(&seal.to_bytes()), VECTOR_SEAL);
    assert_eq!(hex(&compaction.to_bytes()), VECTOR_COMPACTION);
}

const VECTOR_PUBLIC_KEY: &str = "79b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e3910bad049664";
const VECTOR_STREAM: &str = "5e644dd217aee78b";
const VECTOR_SEAL: &str = "8be7ae17d24d645e030000000000000094b555be8b3d3d225342407f28f52588c3c9d4ef32fcf8888a7cb4ed5c2c84e506ef0f1c8a4f595571e6afb0054b880b6ca427d69480784e0979f26ec27daa35e0dfb7814e96deec19bf33563325559c9b4590826f48e9a407c7a5c1de547c0f";
const VECTOR_COMPACTION: &str = "8be7ae17d24d645e0200000000000000222222222222222222222222222222222222222222222222222222222222222264a08e659c4e7500c83a60e453ee608de74d8cf4437e8a0779b7b1cf20532c8ab4e0fe0b404245241120d36cb8ad6184022baefbc4dade015eb427b8383ee6b5ccb6ff9a1e57f0269031db289da5cf23faf56e1c423fb9035db5d558850ad206";
