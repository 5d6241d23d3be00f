#!/usr/bin/env bash
# Loom models of the shared memory ABI (crates/tachyon-abi/tests/loom.rs): every interleaving of
# producers acquiring/completing chunks and the service reading/freeing/scraping them, up to the
# pinned preemption bound. Measured on the development machine: with bound 2 the models run in
# about 60 s (about 2 min with a cold build of loom in release); bound 3 takes about 14 min, too
# long for CI.
set -euo pipefail
cd "$(dirname "$0")/.."

export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
# A separate target dir: `--cfg loom` changes RUSTFLAGS, which would otherwise invalidate the
# normal build cache on every switch.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"
RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}" \
  cargo test -p tachyon-abi --test loom --release -- --test-threads "$(nproc 2>/dev/null || echo 2)"
