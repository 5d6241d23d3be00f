//! Which categories a session enables: Perfetto's `TrackEventConfig` rules.
//!
//! Each entry of the four lists is a glob (`*` any run, `?` one character). A category is
//! checked in this order, and the first hit decides: exact matches in `enabled_categories`,
//! `enabled_tags`, `disabled_categories`, `disabled_tags`, then pattern matches in the same
//! four. With no hit the category is enabled, unless it carries a tag of the default
//! disabled set (`slow`, `debug`) when the config names no tags. Events without a category
//! are checked as the empty category name: only a pattern (`*`) reaches them, so
//! `disabled_categories: "*"` turns them off with everything else.

use tachyon_protos::TrackEventConfigView;

/// The category filter of one session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CategoryFilter {
    enabled_categories: Vec<String>,
    disabled_categories: Vec<String>,
    enabled_tags: Vec<String>,
    disabled_tags: Vec<String>,
}

/// Tags disabled unless the config says otherwise (Perfetto's defaults).
const DEFAULT_DISABLED_TAGS: [&str; 2] = ["slow", "debug"];

impl CategoryFilter {
    /// Everything enabled (except categories tagged `slow` or `debug`).
    pub fn all() -> Self {
        Self::default()
    }

    /// A filter from lists of globs.
    pub fn new(enabled: &[&str], disabled: &[&str]) -> Self {
        CategoryFilter {
            enabled_categories: enabled.iter().map(|s| s.to_string()).collect(),
            disabled_categories: disabled.iter().map(|s| s.to_string()).collect(),
            ..Self::default()
        }
    }

    /// Reads a `TrackEventConfig` (bad bytes: an error, never a panic).
    pub fn from_config(config: &TrackEventConfigView<'_>) -> Result<Self, protozero::DecodeError> {
        let list = |it: &mut dyn Iterator<Item = Result<&str, protozero::DecodeError>>| {
            it.map(|r| r.map(str::to_owned))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(CategoryFilter {
            enabled_categories: list(&mut config.enabled_categories())?,
            disabled_categories: list(&mut config.disabled_categories())?,
            enabled_tags: list(&mut config.enabled_tags())?,
            disabled_tags: list(&mut config.disabled_tags())?,
        })
    }

    /// Whether events of `category` (with `tags`) are recorded; `None` is an uncategorized
    /// event.
    pub fn is_enabled(&self, category: Option<&str>, tags: &[&str]) -> bool {
        let name = category.unwrap_or("");
        let cat_hit = |list: &[String], exact: bool| {
            list.iter().any(|p| {
                if exact {
                    !name.is_empty() && p == name
                } else {
                    glob(p, name)
                }
            })
        };
        let default_tags = self.disabled_tags.is_empty() && self.enabled_tags.is_empty();
        for exact in [true, false] {
            if cat_hit(&self.enabled_categories, exact) || tag_hit(&self.enabled_tags, tags, exact)
            {
                return true;
            }
            let disabled_tag = if default_tags {
                tag_hit(&DEFAULT_DISABLED_TAGS, tags, exact)
            } else {
                tag_hit(&self.disabled_tags, tags, exact)
            };
            if cat_hit(&self.disabled_categories, exact) || disabled_tag {
                return false;
            }
        }
        true
    }
}

/// Whether one of `tags` matches a pattern of `list` (exactly, or as a glob).
fn tag_hit<S: AsRef<str>>(list: &[S], tags: &[&str], exact: bool) -> bool {
    tags.iter().any(|t| {
        list.iter().any(|p| {
            let p = p.as_ref();
            if exact {
                p == *t
            } else {
                glob(p, t)
            }
        })
    })
}

/// Glob match: `*` matches any run of characters, `?` exactly one.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // Iterative matcher with one backtrack point (the last `*`): linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*", ""));
        assert!(glob("*", "net"));
        assert!(glob("net*", "network"));
        assert!(glob("n?t", "net"));
        assert!(!glob("n?t", "nest"));
        assert!(glob("*work*", "network.io"));
        assert!(!glob("net", "network"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
    }

    #[test]
    fn perfetto_rule_order() {
        // Only `io*` enabled: exact/pattern enabled beats the disabled `*`.
        let f = CategoryFilter::new(&["io*"], &["*"]);
        assert!(f.is_enabled(Some("io.disk"), &[]));
        assert!(!f.is_enabled(Some("net"), &[]));
        assert!(!f.is_enabled(None, &[]));
        // Exact disabled beats a pattern enabled.
        let f = CategoryFilter::new(&["*"], &["noisy"]);
        assert!(!f.is_enabled(Some("noisy"), &[]));
        assert!(f.is_enabled(Some("quiet"), &[]));
        assert!(f.is_enabled(None, &[]));
        // Default: enabled, except the default-disabled tags.
        let f = CategoryFilter::all();
        assert!(f.is_enabled(Some("x"), &[]));
        assert!(f.is_enabled(None, &[]));
        assert!(!f.is_enabled(Some("x"), &["slow"]));
    }
}
