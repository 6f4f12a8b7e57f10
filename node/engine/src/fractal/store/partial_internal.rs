//! Partial reads of internal nodes: partition 0 and the one buffer frame on a key's path.

use super::*;

impl Store {
    /// For a point read of `key` (hash `hash`) through internal node `id` without loading it
    /// whole: appends the messages for the key from the one buffer on its path (skipped when the
    /// stored key filter rules the key out) and returns the child to descend into. Reads the
    /// header, partition 0 and at most that one buffer partition, each verified by its crc32c.
    pub(crate) fn read_partial_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        out: &mut Vec<Msg>,
    ) -> Result<NodeId> {
        if let Some(c) = self.partial_internal_probe(id, key, hash, out)? {
            return Ok(c);
        }
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("node {id} is referenced but has no block"),
        })?;
        let location = self.location(id, &loc);
        if self.partial_internal.get(&id).is_none_or(|p| p.loc != loc) {
            self.read_internal_info(id, loc, &location)?;
        }
        if let Some(c) = self.partial_internal_probe(id, key, hash, out)? {
            return Ok(c);
        }
        // The filter says the key may be in the buffer, and that piece has not been read yet.
        self.read_internal_frame(id, loc, key, &location)?;
        let child = self.partial_internal_probe(id, key, hash, out)?;
        self.trim_partial(id);
        child.ok_or_else(|| EngineError::Corruption {
            location: location.to_string(),
            detail: "partial node lost its buffer".into(),
        })
    }

    /// Reads partition 0 (pivots, children, buffer tables and key filters) of internal node
    /// `id` at `loc` into the side cache, replacing what it held for an older block.
    fn read_internal_info(&mut self, id: NodeId, loc: BlockLoc, location: &BlockName) -> Result<()> {
        if let Some(old) = self.partial_internal.remove(&id) {
            self.partial_bytes -= old.bytes;
        }
        let index = self.read_index(id, &loc)?;
        let (Some(&p0), true) = (index.parts.first(), index.height != 0 && index.parts.len() >= 2) else {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: "expected an internal node".into(),
            });
        };
        let raw = self.read_partition(id, &loc, &p0, index.compressed)?;
        let info = decode_internal_info(&raw, index.parts.len() - 1, index.compressed, location)?;
        self.partial_stats.internal_infos += 1;
        self.partial_stats.internal_info_bytes += u64::from(p0.len) + index.parts.len() as u64 * 16;
        let bytes = raw.len() + info.tables_size_bytes() + index.parts.len() * 16 + 64;
        self.partial_bytes += bytes;
        self.partial_internal.insert(
            id,
            PartialInternal {
                loc,
                index,
                info,
                frames: HashMap::new(),
                bytes,
            },
        );
        Ok(())
    }

    /// Reads the frame of the buffer on `key`'s path in internal node `id` (at `loc`, its
    /// partition 0 in the side cache) that can hold the key into the side cache; none when the
    /// buffer has no frame for it.
    fn read_internal_frame(
        &mut self,
        id: NodeId,
        loc: BlockLoc,
        key: &[u8],
        location: &BlockName,
    ) -> Result<()> {
        let Some(p) = self.partial_internal.get(&id) else {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: "partial node vanished".into(),
            });
        };
        let (i, entry) = data_partition(&p.index, &p.info.pivots, key, location)?;
        let frame = match p.info.tables.get(i).map(|t| (t, t.frame_for(key))) {
            Some((t, Some(fi))) => {
                let f = t.points.frames.get(fi).ok_or_else(|| EngineError::Corruption {
                    location: location.to_string(),
                    detail: format!("buffer {i} has no frame {fi}"),
                })?;
                if f.offset + u64::from(f.stored_len) > u64::from(entry.len) {
                    return Err(EngineError::Corruption {
                        location: location.to_string(),
                        detail: format!("frame {fi} of buffer {i} beyond its partition"),
                    });
                }
                let data = self.read_span(
                    id,
                    &loc,
                    u64::from(entry.offset) + f.offset,
                    u64::from(f.stored_len),
                )?;
                let msgs = decode_buffer_frame(&data, t, fi, location)?;
                self.partial_stats.internal_buffer_bytes += data.len() as u64;
                Some((fi, msgs))
            }
            Some((_, None)) => None,
            None => {
                return Err(EngineError::Corruption {
                    location: location.to_string(),
                    detail: format!("buffer {i} has no table"),
                })
            }
        };
        self.partial_stats.internal_buffers += 1;
        if let Some((fi, msgs)) = frame {
            let size = msgs.iter().map(Msg::size_bytes).sum::<usize>() + 64;
            if let Some(p) = self.partial_internal.get_mut(&id) {
                p.bytes += size;
                let old = p.frames.insert((i, fi), msgs);
                debug_assert!(old.is_none(), "frame read twice into the side cache");
                self.partial_bytes += size;
            }
        }
        Ok(())
    }

    /// [`Store::read_partial_internal`] from pieces already read (spilled runs that may hold
    /// the key are read from the file); `None` when a piece is missing.
    pub(crate) fn partial_internal_probe(
        &self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        out: &mut Vec<Msg>,
    ) -> Result<Option<NodeId>> {
        let Some(p) = self.partial_internal.get(&id) else {
            return Ok(None);
        };
        if self.btt.get(&id) != Some(&p.loc) {
            return Ok(None);
        }
        let i = child_index(&p.info.pivots, key);
        let (Some(&child), Some(f)) = (p.info.children.get(i), p.info.filters.get(i)) else {
            return Ok(None);
        };
        let Some(table) = p.info.tables.get(i) else {
            return Ok(None);
        };
        let need = if f.keys.may_contain(hash) {
            table
                .frame_for(key)
                .map_or(BufferNeed::Nothing, BufferNeed::Frame)
        } else {
            BufferNeed::Nothing
        };
        let missing = match need {
            BufferNeed::Nothing => false,
            BufferNeed::Frame(fi) => !p.frames.contains_key(&(i, fi)),
        };
        if missing {
            return Ok(None);
        }
        for r in f.runs.iter().filter(|r| r.may_hold(key, hash)) {
            self.run_msgs_for_key(r.id, key, out)?;
        }
        out.extend(
            table
                .ranges
                .iter()
                .filter(|r| r.covers(key))
                .cloned()
                .map(Msg::Range),
        );
        match need {
            BufferNeed::Nothing => {}
            BufferNeed::Frame(fi) => {
                if let Some(msgs) = p.frames.get(&(i, fi)) {
                    let at = msgs.partition_point(|m| m.key_or_start() < key);
                    let from_key = msgs.get(at..).unwrap_or_default();
                    out.extend(from_key.iter().take_while(|m| m.key_or_start() == key).cloned());
                }
            }
        }
        Ok(Some(child))
    }
}
