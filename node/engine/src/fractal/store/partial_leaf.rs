//! Partial reads of leaves: one basement or one frame without the rest of the block.

use super::*;

/// The data partition of a node that holds `key` (child or basement `i` is partition `i + 1`).
pub(crate) fn data_partition(
    index: &NodeIndex,
    pivots: &[Vec<u8>],
    key: &[u8],
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<(usize, PartEntry)> {
    let i = child_index(pivots, key);
    Ok((i, partition_of(index, i, location)?))
}

/// Data partition of child or basement `i` (partition `i + 1`). Errors: `Corruption` naming
/// `location` when the node has no such partition.
pub(crate) fn partition_of(
    index: &NodeIndex,
    i: usize,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<PartEntry> {
    index
        .parts
        .get(i + 1)
        .copied()
        .ok_or_else(|| EngineError::Corruption {
            location: location.to_string(),
            detail: format!("no partition for child or basement {i}"),
        })
}

impl Store {
    /// Value of `key` in uncached leaf `id` from already-read basements, with the basement's
    /// applied MSN; `None` when that basement has not been read (or the leaf moved).
    pub(crate) fn partial_value(
        &self,
        id: NodeId,
        key: &[u8],
        overriding: Option<Msn>,
    ) -> Option<(Option<Vec<u8>>, Msn)> {
        let p = self.partial.get(&id)?;
        if self.btt.get(&id) != Some(&p.loc) {
            return None;
        }
        match p.spot(key, overriding) {
            LeafSpot::Absent(msn) => {
                self.leaf_reads_avoided.fetch_add(1, Ordering::Relaxed);
                Some((None, msn))
            }
            LeafSpot::Piece(bi, fi) => {
                let b = p.basements.get(&(bi, fi))?;
                Some((b.get(key).map(<[u8]>::to_vec), b.max_msn))
            }
        }
    }

    /// Reads the one basement of uncached leaf `id` that holds `key` (header, pivots and that
    /// partition only; each verified by its crc32c) and returns the key's value and the
    /// basement's applied MSN. The pieces are kept in a small side cache.
    pub(crate) fn read_partial_value(
        &mut self,
        id: NodeId,
        key: &[u8],
        overriding: Option<Msn>,
    ) -> Result<(Option<Vec<u8>>, Msn)> {
        if let Some(v) = self.partial_value(id, key, overriding) {
            return Ok(v);
        }
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("node {id} is referenced but has no block"),
        })?;
        let location = self.location(id, &loc);
        if self.partial.get(&id).is_none_or(|p| p.loc != loc) {
            if let Some(old) = self.partial.remove(&id) {
                self.partial_bytes -= old.bytes;
            }
            let index = self.read_index(id, &loc)?;
            let (Some(&p0), true) = (index.parts.first(), index.height == 0 && index.parts.len() >= 2) else {
                return Err(EngineError::Corruption {
                    location: location.to_string(),
                    detail: "expected a leaf".into(),
                });
            };
            let raw = self.read_partition(id, &loc, &p0, index.compressed)?;
            let info = decode_leaf_info(&raw, index.parts.len() - 1, &location)?;
            self.partial_stats.leaf_infos += 1;
            self.partial_stats.leaf_info_bytes += u64::from(p0.len) + index.parts.len() as u64 * 16;
            self.insert_partial_leaf(id, loc, LeafSkeleton { index, info });
        }
        let Some(p) = self.partial.get(&id) else {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: "partial leaf vanished".into(),
            });
        };
        let (bi, fi) = match p.spot(key, overriding) {
            LeafSpot::Absent(msn) => {
                self.leaf_reads_avoided.fetch_add(1, Ordering::Relaxed);
                return Ok((None, msn));
            }
            LeafSpot::Piece(bi, fi) => (bi, fi),
        };
        // Frame `fi` of basement `bi` (from `spot`).
        let Some(bf) = p.frames.get(bi) else {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: format!("basement {bi} has no frame table"),
            });
        };
        if !self.frame_doorkeeper.admit(loc.offset, bi, fi) {
            // Not kept: look the key up in the frame as read (the skeleton may be new).
            let result = self.lookup_frame(id, p, bi, fi, key)?;
            self.trim_partial(id);
            return Ok(result);
        }
        // One frame, checked against its crc in the (verified) frame table.
        let data = self.read_frame(id, p, bi, fi)?;
        let b = decode_basement_frame(&data, bf, fi, p.index.compressed, &location)?;
        self.frame_reads.fetch_add(1, Ordering::Relaxed);
        self.frame_read_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        recycle_block_buf(data);
        let result = (b.get(key).map(<[u8]>::to_vec), b.max_msn);
        let size = b.size_bytes();
        if let Some(p) = self.partial.get_mut(&id) {
            p.bytes += size;
            p.basements.insert((bi, fi), b);
            self.partial_bytes += size;
        }
        self.trim_partial(id);
        Ok(result)
    }

    /// For a point read under the engine's shared lock: the value of `key` in uncached leaf `id`
    /// and the basement's applied MSN, from the frame table in the side cache and the one frame
    /// that can hold the key, read from the file and not kept ([`FrameDoorkeeper`]). Point reads
    /// beyond memory then need neither the exclusive lock nor a second descent, and run their
    /// reads side by side. `None` when this needs the exclusive path
    /// ([`Store::read_partial_value`]): no frame table cached for the leaf's current block, or
    /// a frame the doorkeeper admits to the side cache.
    /// Errors: `Io`, or `Corruption` naming the block.
    pub(crate) fn read_frame_value_shared(
        &self,
        id: NodeId,
        key: &[u8],
        overriding: Option<Msn>,
    ) -> Result<Option<(Option<Vec<u8>>, Msn)>> {
        let Some(p) = self.partial.get(&id) else {
            return Ok(None);
        };
        if self.btt.get(&id) != Some(&p.loc) {
            return Ok(None);
        }
        let (bi, fi) = match p.spot(key, overriding) {
            LeafSpot::Absent(msn) => {
                self.leaf_reads_avoided.fetch_add(1, Ordering::Relaxed);
                return Ok(Some((None, msn)));
            }
            LeafSpot::Piece(bi, fi) => (bi, fi),
        };
        if p.frames.get(bi).is_none()
            || p.basements.contains_key(&(bi, fi))
            || self.frame_doorkeeper.admit(p.loc.offset, bi, fi)
        {
            return Ok(None);
        }
        let result = self.lookup_frame(id, p, bi, fi, key)?;
        self.frames_shared.fetch_add(1, Ordering::Relaxed);
        Ok(Some(result))
    }

    /// Reads frame `fi` of basement `bi` of partial leaf `p` (leaf `id`) and looks
    /// `key` up in it without decoding the frame into a [`Basement`]: the value and the
    /// basement's applied MSN.
    pub(crate) fn lookup_frame(
        &self,
        id: NodeId,
        p: &PartialLeaf,
        bi: usize,
        fi: usize,
        key: &[u8],
    ) -> Result<(Option<Vec<u8>>, Msn)> {
        let location = self.location(id, &p.loc);
        let Some(bf) = p.frames.get(bi) else {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: format!("basement {bi} has no frame table"),
            });
        };
        let data = self.read_frame(id, p, bi, fi)?;
        let v = lookup_in_frame(&data, bf, fi, p.index.compressed, key, &location)?;
        self.frame_reads.fetch_add(1, Ordering::Relaxed);
        self.frame_read_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        recycle_block_buf(data);
        Ok((v, bf.max_msn))
    }

    /// The stored bytes of frame `fi` of basement `bi` of partial leaf `p` (leaf `id`), after
    /// checking that the frame table has it within the basement's partition (the
    /// frame's own crc is checked by its decoder).
    pub(crate) fn read_frame(&self, id: NodeId, p: &PartialLeaf, bi: usize, fi: usize) -> Result<Vec<u8>> {
        let corrupt = |detail: String| EngineError::Corruption {
            location: self.location(id, &p.loc).to_string(),
            detail,
        };
        let entry = partition_of(&p.index, bi, &self.location(id, &p.loc))?;
        let f = p
            .frames
            .get(bi)
            .and_then(|bf| bf.frames.get(fi))
            .ok_or_else(|| corrupt(format!("basement {bi} has no frame {fi}")))?;
        if u64::from(f.offset) + u64::from(f.stored_len) > u64::from(entry.len) {
            return Err(corrupt(format!(
                "frame {fi} of basement {bi} beyond its partition"
            )));
        }
        self.read_span(
            id,
            &p.loc,
            u64::from(entry.offset) + u64::from(f.offset),
            u64::from(f.stored_len),
        )
    }
}
