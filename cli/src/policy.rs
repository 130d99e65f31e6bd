//! `quotalease policy`: the shared policy store in Redis (tiers and per-key
//! entries), read and written through the library, so the CLI validates
//! exactly as every limiter does (docs/policies.md).

use std::fmt::Write as _;

use quotalease::{Limiter, PolicySource, Rules};

/// What the store is asked (`tier`: about a tier named `name`, else about the key `name`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Action {
    /// Define a tier, or give a key its own entry (`tier:NAME` or rules).
    Set { tier: bool, name: String, value: String },
    /// Show a tier's definition, or a key's entry and the rules it gets.
    Get { tier: bool, name: String },
    /// Remove a tier or a key's entry.
    Delete { tier: bool, name: String },
    /// Every tier and key entry.
    List,
}

/// After a change: who applies it (a limiter polls the store only when asked to).
const FOLLOWED: &str = "limiters configured with policy_refresh_ms > 0 apply it within that period\n";

/// A limiter on the store: its url and prefix are all that matter here.
fn store(redis: &str, key_prefix: &str) -> Result<Limiter, String> {
    Limiter::builder()
        .url(redis)
        .limit(1)
        .window_ms(1_000)
        .key_prefix(key_prefix)
        .backend_timeout_ms(2_000)
        // Any period: the CLI's limiter writes and reads the store.
        .policy_refresh_ms(1_000)
        .build()
        .map_err(crate::explain)
}

/// The rules the store gives `key` and where they come from, as a limiter
/// of the applications resolves them; `None` when they would come from the
/// config of `l` (a CLI limiter's placeholder limit: the entry names a tier
/// the store does not define, which only the applications' config knows).
pub fn stored_rules(l: &Limiter, key: &str) -> quotalease::Result<Option<(Rules, PolicySource)>> {
    let (rules, source) = l.policy(key, None)?;
    Ok((source.defined_by != quotalease::Origin::Config).then_some((rules, source)))
}

/// Run one action and describe its outcome.
pub fn run(redis: &str, key_prefix: &str, action: &Action) -> Result<String, String> {
    let l = store(redis, key_prefix)?;
    let mut out = String::new();
    match action {
        Action::Set {
            tier: true,
            name,
            value,
        } => {
            let v = l.policy_set_tier(name, value).map_err(crate::explain)?;
            let _ = writeln!(out, "tier {name} = {value} (store version {v})");
            out.push_str(FOLLOWED);
        }
        Action::Set {
            tier: false,
            name,
            value,
        } => {
            let v = l.policy_assign(name, value).map_err(crate::explain)?;
            let _ = writeln!(out, "key {name:?} = {value} (store version {v})");
            out.push_str(FOLLOWED);
        }
        Action::Delete { tier: true, name } => {
            let v = l.policy_delete_tier(name).map_err(crate::explain)?;
            let _ = writeln!(out, "tier {name} removed (store version {v})");
            out.push_str(FOLLOWED);
        }
        Action::Delete { tier: false, name } => {
            let v = l.policy_unassign(name).map_err(crate::explain)?;
            let _ = writeln!(out, "key {name:?}: entry removed (store version {v})");
            out.push_str(FOLLOWED);
        }
        Action::Get { tier: true, name } => {
            let list = l.policy_list().map_err(crate::explain)?;
            match list.tiers.iter().find(|(n, _)| n == name) {
                Some((_, rules)) => {
                    let _ = writeln!(out, "tier {name} = {rules}");
                }
                None => return Err(format!("the store defines no tier {name:?}")),
            }
        }
        Action::Get { tier: false, name } => {
            let entry = l.policy_get(name).map_err(crate::explain)?;
            l.refresh_policies().map_err(crate::explain)?;
            let _ = match &entry {
                Some(e) => writeln!(out, "key {name:?}: store entry {e}"),
                None => writeln!(out, "key {name:?}: no store entry (its callers' tier applies)"),
            };
            if entry.is_some() {
                match stored_rules(&l, name) {
                    Ok(None) => {
                        let _ = writeln!(
                            out,
                            "rules      not in the store: the limiters' `tiers` option or policy file defines the tier"
                        );
                    }
                    Ok(Some((rules, source))) => {
                        let _ = writeln!(out, "rules      {rules}: {source}");
                    }
                    Err(e) => {
                        let _ = writeln!(out, "rules      cannot be resolved: {}", crate::explain(e));
                    }
                }
            }
        }
        Action::List => {
            let list = l.policy_list().map_err(crate::explain)?;
            let _ = writeln!(
                out,
                "store {} on {} (version {})",
                quotalease::internals::policy_base(key_prefix),
                quotalease::RedactedUrl(redis),
                list.version
            );
            let _ = writeln!(out, "tiers ({})", list.tiers.len());
            for (n, r) in &list.tiers {
                let _ = writeln!(out, "  {n} = {r}");
            }
            let _ = writeln!(out, "keys ({})", list.keys.len());
            for (k, v) in &list.keys {
                let _ = writeln!(out, "  {k:?} = {v}");
            }
        }
    }
    let _ = l.close();
    Ok(out)
}
