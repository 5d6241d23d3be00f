//! Views of the call-stack tables: CPU profiles from `perf_sample` (top-down and bottom-up, as
//! Tracy's sampling statistics and Perfetto's flamegraphs show them), and zones grouped by the
//! call stack they began in.
//!
//! A frame reads as its symbols when it has them (a frame with inlined functions becomes one
//! entry per function, outermost first; the SDK's macro runtime inlined into the user's
//! function is left out), else its own name, else `binary+0xpc`.
//!
//! ```no_run
//! let tp = tachyon_processor::TraceProcessor::open("trace.pftrace", &Default::default())?;
//! let profile = tachyon_processor::profiles::cpu_profile(&tp)?;
//! for line in profile.bottom_up().iter().take(10) {
//!     println!("{:6} {:6} {}", line.self_samples, line.total_samples, line.name);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, HashMap};

use crate::{Error, TraceProcessor, Value};

/// Stacks with their counts: `stacks[i].0` is a stack of function names, outermost first.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Samples in all.
    pub samples: u64,
    /// Samples without a (resolvable) stack.
    pub without_stack: u64,
    /// Distinct stacks (outermost first) and how many samples each has.
    pub stacks: Vec<(Vec<String>, u64)>,
}

/// One line of a top-down tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeLine {
    /// Distance from the root.
    pub depth: usize,
    /// The function.
    pub name: String,
    /// Samples in it and below.
    pub total_samples: u64,
    /// Samples in it.
    pub self_samples: u64,
}

/// One function of a bottom-up view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionLine {
    /// The function.
    pub name: String,
    /// Samples where it was running.
    pub self_samples: u64,
    /// Samples where it was on the stack.
    pub total_samples: u64,
    /// Its callers in its self samples, most frequent first: (caller chain, innermost caller
    /// first; samples).
    pub callers: Vec<(Vec<String>, u64)>,
}

#[derive(Default)]
struct Node {
    total: u64,
    self_: u64,
    children: BTreeMap<String, Node>,
}

impl Profile {
    /// The top-down tree (callers above callees), children by decreasing samples; nodes with
    /// fewer than `min_samples` samples are left out.
    pub fn top_down(&self, min_samples: u64) -> Vec<TreeLine> {
        let mut root = Node::default();
        for (stack, n) in &self.stacks {
            let mut node = &mut root;
            node.total += n;
            for f in stack {
                node = node.children.entry(f.clone()).or_default();
                node.total += n;
            }
            node.self_ += n;
        }
        let mut out = Vec::new();
        fn walk(node: &Node, depth: usize, min: u64, out: &mut Vec<TreeLine>) {
            let mut kids: Vec<_> = node.children.iter().collect();
            kids.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(b.0)));
            for (name, child) in kids {
                if child.total < min.max(1) {
                    continue;
                }
                out.push(TreeLine {
                    depth,
                    name: name.clone(),
                    total_samples: child.total,
                    self_samples: child.self_,
                });
                walk(child, depth + 1, min, out);
            }
        }
        walk(&root, 0, min_samples, &mut out);
        out
    }

    /// Functions by decreasing self samples, with their callers (up to `depth` levels).
    pub fn bottom_up(&self) -> Vec<FunctionLine> {
        /// Self samples, total samples, callers.
        type Counts = (u64, u64, HashMap<Vec<String>, u64>);
        let mut by_fn: HashMap<&str, Counts> = HashMap::new();
        for (stack, n) in &self.stacks {
            let Some(leaf) = stack.last() else {
                continue;
            };
            let e = by_fn.entry(leaf).or_default();
            e.0 += n;
            let callers: Vec<String> = stack.iter().rev().skip(1).take(3).cloned().collect();
            *e.2.entry(callers).or_default() += n;
            // Total: once per sample for each distinct function on the stack.
            let mut seen: Vec<&str> = Vec::new();
            for f in stack {
                if !seen.contains(&f.as_str()) {
                    seen.push(f);
                    by_fn.entry(f).or_default().1 += n;
                }
            }
        }
        let mut out: Vec<FunctionLine> = by_fn
            .into_iter()
            .map(|(name, (self_samples, total_samples, callers))| {
                let mut callers: Vec<_> = callers.into_iter().collect();
                callers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                FunctionLine {
                    name: name.to_owned(),
                    self_samples,
                    total_samples,
                    callers,
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.self_samples
                .cmp(&a.self_samples)
                .then(b.total_samples.cmp(&a.total_samples))
                .then(a.name.cmp(&b.name))
        });
        out
    }
}

/// Names of every frame: frame id → names, outermost first.
fn frame_names(tp: &TraceProcessor) -> Result<HashMap<i64, Vec<String>>, Error> {
    let r = tp.query(
        "SELECT f.id, f.name, f.rel_pc, m.name, s.name FROM stack_profile_frame f \
         LEFT JOIN stack_profile_mapping m ON m.id = f.mapping \
         LEFT JOIN stack_profile_symbol s ON s.symbol_set_id = f.symbol_set_id \
         ORDER BY f.id, s.id DESC",
    )?;
    let mut out: HashMap<i64, Vec<String>> = HashMap::new();
    for row in r.rows {
        let (Value::Integer(id), name, pc, mapping, symbol) =
            (&row[0], &row[1], &row[2], &row[3], &row[4])
        else {
            continue;
        };
        let names = out.entry(*id).or_default();
        match (symbol, name) {
            // The SDK's own code inlined into the function that took the stack (the macro's
            // runtime): not the user's, left out as Tracy does.
            (Value::Text(s), _) if s.starts_with("tachyon::track_event::__rt::") => {}
            // Symbol lines are innermost first: read in reverse, they are outermost first.
            (Value::Text(s), _) => names.push(s.clone()),
            (_, Value::Text(n)) if !n.is_empty() && names.is_empty() => names.push(n.clone()),
            _ if names.is_empty() => {
                let module = match mapping {
                    Value::Text(m) => m.rsplit('/').next().unwrap_or(m).to_owned(),
                    _ => "?".to_owned(),
                };
                let pc = match pc {
                    Value::Integer(p) => *p as u64,
                    _ => 0,
                };
                names.push(format!("{module}+{pc:#x}"));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Callsite id → (parent, frame).
fn callsites(tp: &TraceProcessor) -> Result<HashMap<i64, (Option<i64>, i64)>, Error> {
    let r = tp.query("SELECT id, parent_id, frame_id FROM stack_profile_callsite")?;
    Ok(r.rows
        .into_iter()
        .filter_map(|row| match (&row[0], &row[1], &row[2]) {
            (Value::Integer(id), parent, Value::Integer(frame)) => {
                let parent = match parent {
                    Value::Integer(p) => Some(*p),
                    _ => None,
                };
                Some((*id, (parent, *frame)))
            }
            _ => None,
        })
        .collect())
}

/// The names of a callsite's stack, outermost first (bounded: a corrupt chain cannot loop).
fn stack_of(
    callsite: i64,
    sites: &HashMap<i64, (Option<i64>, i64)>,
    names: &HashMap<i64, Vec<String>>,
) -> Vec<String> {
    let mut frames = Vec::new();
    let mut c = Some(callsite);
    while let Some(id) = c {
        let Some(&(parent, frame)) = sites.get(&id) else {
            break;
        };
        frames.push(frame);
        if frames.len() > 4096 {
            break;
        }
        c = parent;
    }
    frames
        .iter()
        .rev()
        .flat_map(|f| names.get(f).cloned().unwrap_or_default())
        .collect()
}

/// The CPU profile of the trace's `perf_sample` rows (all threads).
pub fn cpu_profile(tp: &TraceProcessor) -> Result<Profile, Error> {
    let r = tp.query("SELECT callsite_id, count(*) FROM perf_sample GROUP BY callsite_id")?;
    let names = frame_names(tp)?;
    let sites = callsites(tp)?;
    let mut p = Profile::default();
    for row in r.rows {
        let n = match row[1] {
            Value::Integer(n) => n as u64,
            _ => 0,
        };
        p.samples += n;
        match row[0] {
            Value::Integer(c) => {
                let stack = stack_of(c, &sites, &names);
                if stack.is_empty() {
                    p.without_stack += n;
                } else {
                    p.stacks.push((stack, n));
                }
            }
            _ => p.without_stack += n,
        }
    }
    p.stacks.sort();
    Ok(p)
}

/// Zones (slices) that carry a call stack, grouped by name and stack.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneStack {
    /// The zone's name.
    pub zone: String,
    /// Its stack, outermost first.
    pub stack: Vec<String>,
    /// Instances with this stack.
    pub count: u64,
    /// Their total duration in ns (unfinished ones count 0).
    pub total_ns: i64,
}

/// Every (zone, call stack) pair of the trace, by decreasing total time.
pub fn zone_callstacks(tp: &TraceProcessor) -> Result<Vec<ZoneStack>, Error> {
    let r = tp.query(
        "SELECT s.name, e.callsite_id, count(*), sum(max(s.dur, 0)) \
         FROM __intrinsic_track_event_callstacks e JOIN slice s ON s.id = e.slice_id \
         WHERE e.callsite_id IS NOT NULL GROUP BY s.name, e.callsite_id",
    )?;
    let names = frame_names(tp)?;
    let sites = callsites(tp)?;
    let mut out: Vec<ZoneStack> = r
        .rows
        .into_iter()
        .filter_map(|row| match (&row[0], &row[1], &row[2], &row[3]) {
            (zone, Value::Integer(c), Value::Integer(n), total) => Some(ZoneStack {
                zone: match zone {
                    Value::Text(z) => z.clone(),
                    _ => String::new(),
                },
                stack: stack_of(*c, &sites, &names),
                count: *n as u64,
                total_ns: match total {
                    Value::Integer(t) => *t,
                    _ => 0,
                },
            }),
            _ => None,
        })
        .collect();
    out.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then(b.count.cmp(&a.count))
            .then(a.zone.cmp(&b.zone))
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_count_what_they_should() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let p = Profile {
            samples: 10,
            without_stack: 0,
            stacks: vec![
                (s(&["main", "work", "spin"]), 6),
                (s(&["main", "work"]), 1),
                (s(&["main", "io", "spin"]), 3),
            ],
        };
        let td = p.top_down(1);
        assert_eq!(td[0].name, "main");
        assert_eq!(td[0].total_samples, 10);
        assert_eq!(
            (td[1].name.as_str(), td[1].total_samples, td[1].self_samples),
            ("work", 7, 1)
        );
        let bu = p.bottom_up();
        assert_eq!(
            (bu[0].name.as_str(), bu[0].self_samples, bu[0].total_samples),
            ("spin", 9, 9)
        );
        assert_eq!(bu[0].callers[0], (s(&["work", "main"]), 6));
        let main = bu.iter().find(|f| f.name == "main").unwrap();
        assert_eq!((main.self_samples, main.total_samples), (0, 10));
    }
}
