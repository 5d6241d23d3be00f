//! An end event's args merged into its slice's, as Perfetto merges them (the begin's and the
//! end's args go through one args inserter there): an arg whose key the slice already has
//! replaces that value in place, and an array continues after the slice's last element
//! instead of starting again at `[0]` (`debug.a[0..1]` from the begin and two elements from
//! the end give `debug.a[0..3]`). Other args are appended.
//!
//! To find the slice's args without scanning the whole args table, where each open slice's arg
//! set starts is kept beside it on its track's stack while the slice is open (`track_event.rs`);
//! the storage reads and updates the set (`Storage::arg_set_keys`, `Storage::update_arg`).

use crate::importers::{Event, Parser, PendingArg};
use crate::storage::strings::{FxHashMap, StrId};

impl Parser {
    /// Merges the args of end event `ev` into the slice's arg set `set` (not `NONE`), whose
    /// late args come after `mark` ([`crate::storage::Storage::arg_mark`] when the slice
    /// began).
    pub(crate) fn merge_end_args(&mut self, set: u32, mark: usize, ev: &Event) {
        if ev.nargs == 0 {
            return;
        }
        // The slice's args: key → row, and each array's next index (from its keys' `[i]`s).
        let mut rows: FxHashMap<StrId, usize> = FxHashMap::default();
        let mut next_index: FxHashMap<String, u64> = FxHashMap::default();
        for (i, key) in self.st.arg_set_keys(set, mark) {
            rows.insert(key, i);
            let key = self.st.strings.get(key);
            for (prefix, index) in array_indices(key) {
                let next = next_index.entry(prefix.to_owned()).or_default();
                *next = (*next).max(index.saturating_add(1));
            }
        }
        // The end's own args, a repeated key keeping its first place and its last value.
        let mut added: Vec<PendingArg> = Vec::new();
        let mut added_at: FxHashMap<StrId, usize> = FxHashMap::default();
        for i in ev.args as usize..(ev.args + ev.nargs) as usize {
            let Some(mut a) = self.arena_args.get(&self.st.args, i) else {
                continue;
            };
            if a.key == crate::storage::NONE {
                match self.passthrough_utid(i, ev, true) {
                    Some(v) => (a.key, a.value) = (a.flat_key, v),
                    None => continue,
                }
            }
            a.key = self.continued_key(a.key, &next_index);
            if let Some(&row) = rows.get(&a.key) {
                self.st.update_arg(row, a.flat_key, a.value);
            } else if let Some(&j) = added_at.get(&a.key) {
                added[j] = a;
            } else {
                added_at.insert(a.key, added.len());
                added.push(a);
            }
        }
        for a in added {
            self.st.push_arg(set, a.flat_key, a.key, a.value);
        }
    }

    /// `key` with each array index shifted past the slice's elements of that array.
    fn continued_key(&mut self, key: StrId, next_index: &FxHashMap<String, u64>) -> StrId {
        let s = self.st.strings.get(key);
        if next_index.is_empty() || !s.contains('[') {
            return key;
        }
        let mut out = String::with_capacity(s.len() + 4);
        let mut rest = s;
        while let Some(open) = rest.find('[') {
            let Some(close) = rest[open..].find(']').map(|c| open + c) else {
                break;
            };
            out.push_str(&rest[..open]);
            match rest[open + 1..close].parse::<u64>() {
                Ok(i) => {
                    let base = next_index.get(out.as_str()).copied().unwrap_or(0);
                    out.push_str(&format!("[{}]", base.saturating_add(i)));
                }
                Err(_) => out.push_str(&rest[open..=close]),
            }
            rest = &rest[close + 1..];
        }
        out.push_str(rest);
        if out == s {
            key
        } else {
            self.st.strings.intern(&out)
        }
    }
}

/// The array elements named in `key`: (the array's key, the index) for each `[i]`.
fn array_indices(key: &str) -> impl Iterator<Item = (&str, u64)> {
    let mut from = 0;
    std::iter::from_fn(move || loop {
        let open = from + key[from..].find('[')?;
        let close = open + key[open..].find(']')?;
        from = close + 1;
        if let Ok(i) = key[open + 1..close].parse() {
            return Some((&key[..open], i));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::array_indices;

    #[test]
    fn array_indices_name_each_array_of_a_key() {
        let got: Vec<_> = array_indices("debug.a[2].b[10].c[x]").collect();
        assert_eq!(got, [("debug.a", 2), ("debug.a[2].b", 10)]);
        assert_eq!(array_indices("debug.plain").count(), 0);
    }
}
