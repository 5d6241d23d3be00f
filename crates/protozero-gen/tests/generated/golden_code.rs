//! The golden files of `tests/golden/`, mounted where their packages belong: the per-package
//! files as `pz::common`, `pz::test` and `pz::test::three` (as a `build.rs` user would mount
//! them), and the single-file layout under `single`. Compiling this module is the check that
//! the generated code builds, warning-free under the lints below and clippy.
#![deny(
    warnings,
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    unused_qualifications
)]

/// Package `pz` (per-package layout).
pub mod pz {
    /// Package `pz.common`.
    pub mod common {
        include!("../golden/pz.common.rs");
    }
    /// Package `pz.test`.
    pub mod test {
        include!("../golden/pz.test.rs");
        /// Package `pz.test.three`.
        pub mod three {
            include!("../golden/pz.test.three.rs");
        }
    }
}

/// All packages in the single-file layout.
pub mod single {
    include!("../golden/single.rs");
}
