//! The policy file (`policy_file`): tiers and per-key policies in TOML, for
//! users without a central store.
//!
//! ```toml
//! default_tier = "free"          # optional
//!
//! [tiers]
//! free = "100/min"
//! pro = ["6000/min", "1000000/day"]   # or "6000/min, 1000000/day"
//!
//! [keys]
//! "user:42" = "tier:pro"
//! "user:7" = "10/s, 100/day"
//! ```

use std::collections::HashMap;
use std::time::SystemTime;

use super::{validate_tier_name, Assignment, Rules, Tier};
use crate::error::{Error, Result};

/// A policy file as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyFile {
    /// The file's tiers.
    pub tiers: Vec<Tier>,
    /// The file's per-key policies.
    pub keys: HashMap<String, Assignment>,
    /// The file's `default_tier`, if any.
    pub default_tier: Option<String>,
    /// Modification time when read (to notice changes).
    pub modified: Option<SystemTime>,
}

fn bad(path: &str, what: impl std::fmt::Display) -> Error {
    Error::config("policy_file", format!("{path}: {what}"))
}

/// Read and check a policy file.
pub fn read(path: &str) -> Result<PolicyFile> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let text = std::fs::read_to_string(path).map_err(|e| bad(path, format!("cannot be read: {e}")))?;
    let mut f = parse(&text).map_err(|e| match e {
        Error::Config { reason, .. } => bad(path, reason),
        e => e,
    })?;
    f.modified = modified;
    Ok(f)
}

/// Parse a policy file's text.
pub fn parse(text: &str) -> Result<PolicyFile> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| Error::config("policy_file", format!("is not valid TOML: {}", e.message())))?;
    let mut out = PolicyFile::default();
    for (name, value) in &table {
        match (name.as_str(), value) {
            ("default_tier", toml::Value::String(t)) => {
                validate_tier_name(t)?;
                out.default_tier = Some(t.clone());
            }
            ("tiers", toml::Value::Table(tiers)) => {
                for (tier, rules) in tiers {
                    validate_tier_name(tier)?;
                    out.tiers.push(Tier {
                        name: tier.clone(),
                        rules: rules_of(rules, &format!("tier {tier:?}"))?,
                    });
                }
            }
            ("keys", toml::Value::Table(keys)) => {
                for (key, v) in keys {
                    crate::keys::validate_key(key)?;
                    let a = match v {
                        toml::Value::String(s) => Assignment::parse(s),
                        toml::Value::Table(t) if t.len() == 1 && t.contains_key("tier") => match &t["tier"] {
                            toml::Value::String(name) => {
                                validate_tier_name(name).map(|_| Assignment::Tier(name.clone()))
                            }
                            _ => Err(Error::config("policy_file", "a tier name is a string")),
                        },
                        other => rules_of(other, "").map(Assignment::Rules),
                    }
                    .map_err(|e| Error::config("policy_file", format!("key {key:?}: {e}")))?;
                    out.keys.insert(key.clone(), a);
                }
            }
            (other, _) => {
                return Err(Error::config(
                    "policy_file",
                    format!("has {other:?}; it holds `default_tier` (a string), [tiers] and [keys]"),
                ))
            }
        }
    }
    if let Some(d) = &out.default_tier {
        if !out.tiers.iter().any(|t| &t.name == d) {
            return Err(Error::config(
                "policy_file",
                format!("default_tier {d:?} is not one of its [tiers]"),
            ));
        }
    }
    Ok(out)
}

fn rules_of(v: &toml::Value, what: &str) -> Result<Rules> {
    let with = |e: Error| match e {
        Error::Config { reason, .. } if !what.is_empty() => Error::config("policy_file", format!("{what}: {reason}")),
        e => e,
    };
    match v {
        toml::Value::String(s) => Rules::parse(s, "policy_file").map_err(with),
        toml::Value::Array(items) => {
            let mut text = String::new();
            for item in items {
                let toml::Value::String(s) = item else {
                    return Err(with(Error::config("policy_file", "rules are strings like \"100/min\"")));
                };
                if !text.is_empty() {
                    text.push(',');
                }
                text.push_str(s);
            }
            Rules::parse(&text, "policy_file").map_err(with)
        }
        _ => Err(with(Error::config(
            "policy_file",
            "rules are a string (\"10/s, 1000/day\") or a list of strings",
        ))),
    }
}

/// The file's modification time now (`None` when it cannot be read).
pub fn modified(path: &str) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_tiers_and_keys() {
        let f = parse(
            r#"
default_tier = "free"
[tiers]
free = "100/min"
pro = ["6000/min", "1000000/day"]
[keys]
"user:42" = "tier:pro"
"user:43" = { tier = "free" }
"user:7" = "10/s, 100/day"
"#,
        )
        .unwrap();
        assert_eq!(f.default_tier.as_deref(), Some("free"));
        assert_eq!(f.tiers.len(), 2);
        let pro = f.tiers.iter().find(|t| t.name == "pro").unwrap();
        assert_eq!(pro.rules.to_string(), "6000/min, 1000000/day");
        assert_eq!(f.keys["user:42"], Assignment::Tier("pro".into()));
        assert_eq!(f.keys["user:43"], Assignment::Tier("free".into()));
        assert_eq!(f.keys["user:7"].to_string(), "10/s, 100/day");
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        for (text, says) in [
            ("[tiers]\nfree = 5", "rules are a string"),
            ("[tiers]\nfree = \"5/fortnight\"", "tier \"free\""),
            (
                "default_tier = \"gold\"\n[tiers]\nfree = \"1/s\"",
                "default_tier \"gold\"",
            ),
            ("[keys]\n\"k\" = \"tier:\"", "key \"k\""),
            ("limit = 5", "has \"limit\""),
            ("[tiers", "not valid TOML"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains("`policy_file`") && e.contains(says), "{text:?}: {e}");
        }
    }
}
