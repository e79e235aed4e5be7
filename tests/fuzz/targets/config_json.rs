//! Config documents: any JSON goes through validation, the typed view, the
//! dotted-path editor and the agent write policy without a panic, and the
//! stored text round-trips.
#![no_main]

use adf::store::config;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<Value>(data) else { return };
    let issues = config::validate(&v);
    let _ = config::AgentConfig::from_value(&v);
    let text = serde_json::to_string(&v).expect("serialises");
    let back: Value = serde_json::from_str(&text).expect("stored text parses");
    assert_eq!(back, v, "stored text round-trips");
    let mut edited = v.clone();
    for i in issues.iter().take(8) {
        let _ = config::set_path(&mut edited, &i.path, Value::Null);
        let _ = config::get_path(&edited, &i.path);
        let _ = config::agent_write_policy(&v, &i.path);
    }
    // Paths taken from the document's own strings.
    if let Value::Object(o) = &v {
        for (k, x) in o.iter().take(8) {
            let _ = config::get_path(&v, k);
            let _ = config::set_path(&mut edited, k, x.clone());
            let _ = config::agent_write_policy(&v, k);
        }
    }
    let _ = config::new_issues(&v, &edited);
});
