#!/usr/bin/env bash
# Miri over the client SDK's unsafe code (crates/tachyon): raw writes into shared memory chunks,
# the scratch chunk, patch slots, the arbiter's lifetime extension, the protozero delegate.
# Runs the unit tests and the writer tests that drive every delegate path (chunk switches,
# continuations, carries, patches, drop sentinels and markers, protozero errors, thread-local
# writers),
# under Stacked Borrows and under Tree Borrows. The property and stress tests are too slow for
# Miri; they run natively in `cargo test`. About 2 minutes on the development machine.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly miri --version >/dev/null 2>&1; then
  rustup component add --toolchain nightly miri rust-src
fi
# A separate target dir: Miri's build artefacts do not mix with the normal ones.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/miri"
# Isolation off: the stall tests read the clock and sleep.
for model in "" "-Zmiri-tree-borrows"; do
  export MIRIFLAGS="-Zmiri-disable-isolation $model"
  cargo +nightly miri test -p tachyon --lib
  cargo +nightly miri test -p tachyon --test writer -- \
    a_packet_is count_inflation a_packet_across_chunks_has no_chunk_in_the_middle \
    no_chunk_at_a_packet a_wait_that_times_out a_protozero_error a_leaked_nested a_small_packet_cut \
    the_thread_local dropping_the_writer request_flush an_empty_packet writers_move
done
