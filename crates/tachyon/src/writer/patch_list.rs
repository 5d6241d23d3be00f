//! Patch slots: where the size of a nested message goes when its size field lies in a chunk the
//! writer has already handed to the service.
//!
//! When a packet crosses a chunk boundary, protozero asks the writer (through
//! `Delegate::annotate_patch`) where to write the size of every nested message still open in the
//! chunk being left. The writer answers with a 4-byte *slot* from this list and remembers which
//! chunk and offset the slot stands for. When the message ends, protozero writes its size into
//! the slot; a written size never starts with `0x00` (it is a redundant varint), so a slot whose
//! first byte is non-zero is *ready*. Ready slots are shipped with the next commit as
//! `ChunkToPatch` entries, grouped per chunk, and go back to the free list.
//!
//! # Memory
//!
//! Slots live in fixed blocks of [`BLOCK_SLOTS`], allocated on the heap and never moved or freed
//! before the list is dropped: protozero holds raw pointers to them. One block is allocated with
//! the writer; another only when more than [`BLOCK_SLOTS`] slots are outstanding at once (more
//! than 16 nested messages open across chunk boundaries and not yet shipped), which is a cold
//! path. Blocks are held as raw pointers rather than `Box`es so that moving the list never
//! asserts uniqueness over memory the writer still points into.
//!
//! Ready slots are shipped in any order: a chunk's patches are sent as soon as one of them is
//! ready, with `has_more_patches` set while another slot for the same chunk is still unwritten.
//! So the number of outstanding slots stays bounded by the number of open nested messages
//! (at most protozero's nesting limit) plus those that became ready since the last commit.

use std::fmt;
use std::ptr;

use protozero::wire::redundant_varint;
use tachyon_abi::{ChunkToPatch, Patch};

/// Slots per heap block.
pub(crate) const BLOCK_SLOTS: usize = 16;

/// What a slot stands for.
#[derive(Clone, Copy, Debug, Default)]
struct SlotMeta {
    chunk_id: u32,
    /// From the start of the chunk's payload.
    offset: u32,
}

/// The patch slots of one writer.
pub(crate) struct PatchList {
    /// Each entry points at `BLOCK_SLOTS` slots from `Box::<[[u8; 4]]>::into_raw`, freed in
    /// `Drop`.
    blocks: Vec<*mut [u8; 4]>,
    /// Indexed by slot number (`block * BLOCK_SLOTS + i`).
    meta: Vec<SlotMeta>,
    /// Slot numbers not handed out.
    free: Vec<u32>,
    /// Slot numbers handed out and not shipped yet, in the order they were handed out.
    outstanding: Vec<u32>,
}

impl fmt::Debug for PatchList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PatchList")
            .field("slots", &self.meta.len())
            .field("outstanding", &self.outstanding.len())
            .finish()
    }
}

impl PatchList {
    /// A list with one block of slots.
    pub(crate) fn new() -> Self {
        let mut list = PatchList {
            blocks: Vec::with_capacity(4),
            meta: Vec::with_capacity(BLOCK_SLOTS),
            free: Vec::with_capacity(BLOCK_SLOTS),
            outstanding: Vec::with_capacity(BLOCK_SLOTS),
        };
        list.grow();
        list
    }

    /// Adds a block and puts its slots on the free list (cold: see the module docs).
    #[cold]
    fn grow(&mut self) {
        let block = Box::into_raw(vec![[0u8; 4]; BLOCK_SLOTS].into_boxed_slice());
        let first = self.meta.len() as u32;
        self.blocks.push(block.cast::<[u8; 4]>());
        self.meta
            .resize(self.meta.len() + BLOCK_SLOTS, SlotMeta::default());
        // Highest first, so that `pop` hands out the lowest number.
        self.free.extend((first..first + BLOCK_SLOTS as u32).rev());
    }

    /// Address of slot `n`.
    fn slot(&self, n: u32) -> *mut [u8; 4] {
        let n = n as usize;
        // Inside the block's allocation (`n % BLOCK_SLOTS < BLOCK_SLOTS`, see `grow`); only an
        // address computation, the accesses below are the unsafe part.
        self.blocks[n / BLOCK_SLOTS].wrapping_add(n % BLOCK_SLOTS)
    }

    /// The current bytes of slot `n`.
    fn read(&self, n: u32) -> [u8; 4] {
        // SAFETY: the slot is inside a live block (see `slot`). Only this thread writes slots
        // (protozero, through the pointer `alloc` returned, during calls that cannot overlap
        // this one), and no reference to slot memory ever exists, so a plain read is not a race
        // and aliases nothing.
        unsafe { ptr::read(self.slot(n)) }
    }

    fn is_ready(&self, n: u32) -> bool {
        self.read(n)[0] != 0
    }

    /// Hands out a zeroed slot standing for the size field at `offset` in chunk `chunk_id`.
    /// The pointer stays valid until the list is dropped; the slot is reused only after its first
    /// byte became non-zero and it was shipped.
    pub(crate) fn alloc(&mut self, chunk_id: u32, offset: u32) -> *mut u8 {
        let n = match self.free.pop() {
            Some(n) => n,
            None => {
                self.grow();
                self.free.pop().expect("grow adds free slots")
            }
        };
        let slot = self.slot(n);
        // SAFETY: `slot` is inside a live block; the slot is free, so nobody else (protozero
        // included) holds it any more.
        unsafe { ptr::write(slot, [0; 4]) };
        self.meta[n as usize] = SlotMeta { chunk_id, offset };
        self.outstanding.push(n);
        slot.cast::<u8>()
    }

    /// Whether any slot is handed out and not shipped.
    #[inline(always)]
    pub(crate) fn has_outstanding(&self) -> bool {
        !self.outstanding.is_empty()
    }

    /// Whether any outstanding slot is ready.
    pub(crate) fn any_ready(&self) -> bool {
        self.outstanding.iter().any(|&n| self.is_ready(n))
    }

    /// Moves every ready slot into `out`, one [`ChunkToPatch`] per chunk (in the order the
    /// chunks' first slots were handed out), with `has_more_patches` set when a slot for the
    /// same chunk is still unwritten. Returns the number of patches moved.
    pub(crate) fn take_ready(
        &mut self,
        writer_id: u16,
        target_buffer: u16,
        out: &mut Vec<ChunkToPatch>,
    ) -> usize {
        let first_group = out.len();
        let mut moved = 0;
        let mut keep = 0;
        for i in 0..self.outstanding.len() {
            let n = self.outstanding[i];
            let data = self.read(n);
            if data[0] == 0 {
                self.outstanding[keep] = n;
                keep += 1;
                continue;
            }
            let meta = self.meta[n as usize];
            let patch = Patch {
                offset: meta.offset,
                data,
            };
            match out[first_group..]
                .iter_mut()
                .find(|g| g.chunk_id == meta.chunk_id)
            {
                Some(group) => group.patches.push(patch),
                None => out.push(ChunkToPatch {
                    target_buffer,
                    writer_id,
                    chunk_id: meta.chunk_id,
                    patches: vec![patch],
                    has_more_patches: false,
                }),
            }
            self.free.push(n);
            moved += 1;
        }
        self.outstanding.truncate(keep);
        for group in &mut out[first_group..] {
            group.has_more_patches = self
                .outstanding
                .iter()
                .any(|&n| self.meta[n as usize].chunk_id == group.chunk_id);
        }
        moved
    }

    /// Writes a zero size (`80 80 80 00`) into every unwritten slot, making it ready. Used when
    /// the writer abandons a packet whose nested messages will never end normally, so that the
    /// chunks waiting for those patches are not held back forever (the packet itself is marked
    /// dropped elsewhere).
    pub(crate) fn force_ready(&mut self) {
        for i in 0..self.outstanding.len() {
            let n = self.outstanding[i];
            if !self.is_ready(n) {
                // SAFETY: as in `alloc`; protozero will not write this slot any more (the packet
                // is abandoned), and if it did it would write 4 bytes into memory that stays
                // valid until the list is dropped.
                unsafe { ptr::write(self.slot(n), redundant_varint(0)) };
            }
        }
    }
}

impl Drop for PatchList {
    fn drop(&mut self) {
        for &block in &self.blocks {
            let slice = ptr::slice_from_raw_parts_mut(block, BLOCK_SLOTS);
            // SAFETY: `block` came from `Box::into_raw` of a boxed slice of exactly
            // `BLOCK_SLOTS` slots (see `grow`), and each block is freed once, here.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: *mut u8, bytes: [u8; 4]) {
        // SAFETY: `p` came from `alloc` on a list that is still alive.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), p, 4) };
    }

    #[test]
    fn unready_slots_are_not_shipped() {
        let mut list = PatchList::new();
        let _a = list.alloc(7, 100);
        let mut out = Vec::new();
        assert_eq!(list.take_ready(1, 0, &mut out), 0);
        assert!(out.is_empty());
        assert!(list.has_outstanding());
        assert!(!list.any_ready());
    }

    #[test]
    fn groups_per_chunk_with_has_more() {
        let mut list = PatchList::new();
        let a0 = list.alloc(7, 100);
        let a1 = list.alloc(7, 120);
        let b0 = list.alloc(8, 4);
        write(a1, [0x85, 0x80, 0x80, 0x00]);
        write(b0, [0x86, 0x80, 0x80, 0x00]);
        let mut out = Vec::new();
        assert_eq!(list.take_ready(3, 2, &mut out), 2);
        assert_eq!(
            out,
            [
                ChunkToPatch {
                    target_buffer: 2,
                    writer_id: 3,
                    chunk_id: 7,
                    patches: vec![Patch {
                        offset: 120,
                        data: [0x85, 0x80, 0x80, 0x00]
                    }],
                    has_more_patches: true,
                },
                ChunkToPatch {
                    target_buffer: 2,
                    writer_id: 3,
                    chunk_id: 8,
                    patches: vec![Patch {
                        offset: 4,
                        data: [0x86, 0x80, 0x80, 0x00]
                    }],
                    has_more_patches: false,
                },
            ]
        );
        write(a0, [0x87, 0x80, 0x80, 0x00]);
        let mut out = Vec::new();
        assert_eq!(list.take_ready(3, 2, &mut out), 1);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].chunk_id, 7);
        assert!(!out[0].has_more_patches);
        assert!(!list.has_outstanding());
    }

    #[test]
    fn slots_are_reused_and_blocks_grow_without_moving() {
        let mut list = PatchList::new();
        let first: Vec<*mut u8> = (0..BLOCK_SLOTS as u32).map(|i| list.alloc(1, i)).collect();
        // A 17th outstanding slot needs a second block; the first block's slots stay put.
        let extra = list.alloc(2, 0);
        assert!(!first.contains(&extra));
        for &p in &first {
            write(p, [0x81, 0x80, 0x80, 0x00]);
        }
        let mut out = Vec::new();
        assert_eq!(list.take_ready(1, 0, &mut out), BLOCK_SLOTS);
        // A reused slot comes back zeroed.
        let again = list.alloc(3, 0);
        assert!(first.contains(&again));
        // SAFETY: `again` came from `alloc` on a live list.
        assert_eq!(unsafe { ptr::read(again.cast::<[u8; 4]>()) }, [0; 4]);
    }

    #[test]
    fn force_ready_makes_everything_shippable() {
        let mut list = PatchList::new();
        list.alloc(1, 8);
        list.alloc(2, 12);
        list.force_ready();
        let mut out = Vec::new();
        assert_eq!(list.take_ready(1, 0, &mut out), 2);
        assert!(out.iter().all(|g| !g.has_more_patches));
        assert_eq!(out[0].patches[0].data, [0x80, 0x80, 0x80, 0x00]);
    }
}
