//! Node sources for reads: loading nodes under the exclusive lock, or cached nodes only.

use super::*;

/// Where reads get nodes from: the cache only (shared lock; a miss aborts the read) or the
/// cache with loading and eviction (exclusive lock).
pub(crate) trait Fetch {
    /// The node, `Ok(None)` when it is not cached and this source cannot load.
    fn fetch(&mut self, id: NodeId) -> Result<Option<&Node>>;
    /// Called after each leaf of a scan (evicts down to budget when allowed).
    fn after_leaf(&mut self, root: NodeId) -> Result<()>;
    /// For a point read reaching leaf `id`: its value and basement MSN from a partial read when
    /// the leaf is not cached whole. `overriding` is the MSN of the newest collected message that
    /// sets or deletes the key outright: when it is above the basement's applied MSN the stored
    /// value cannot matter, and the frame is not read (the value comes back `None`).
    fn probe_leaf(&mut self, id: NodeId, key: &[u8], overriding: Option<Msn>) -> Result<LeafProbe> {
        if self.store().is_cached(id) {
            return Ok(LeafProbe::UseNode);
        }
        self.probe_uncached_leaf(id, key, overriding)
    }
    /// For a point read passing internal node `id`: when it is not cached whole, appends the
    /// key's messages from its buffer on the path (read partially) and names the child.
    fn probe_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        msgs: &mut Vec<Msg>,
    ) -> Result<InternalProbe> {
        if self.store().is_cached(id) {
            return Ok(InternalProbe::UseNode);
        }
        self.probe_uncached_internal(id, key, hash, msgs)
    }
    /// [`Fetch::probe_leaf`] for a leaf that is not cached whole.
    fn probe_uncached_leaf(&mut self, id: NodeId, key: &[u8], overriding: Option<Msn>) -> Result<LeafProbe>;
    /// [`Fetch::probe_internal`] for an internal node that is not cached whole.
    fn probe_uncached_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        msgs: &mut Vec<Msg>,
    ) -> Result<InternalProbe>;
    /// The store, for reading spilled runs (file reads only, no cache).
    fn store(&self) -> &Store;
}

/// Outcome of [`Fetch::probe_internal`].
pub(crate) enum InternalProbe {
    /// Descend into this child (the node's messages for the key were collected).
    Child(NodeId),
    /// The node is cached: read it as a node.
    UseNode,
    /// Not available without I/O.
    Miss,
}

/// Outcome of [`Fetch::probe_leaf`].
pub(crate) enum LeafProbe {
    /// Value of the key in its basement and the basement's applied MSN.
    Value(Option<Vec<u8>>, Msn),
    /// The leaf is cached: read it as a node.
    UseNode,
    /// Not available without I/O (shared-lock readers retry exclusively).
    Miss,
}

pub(crate) struct Loading<'a>(pub(crate) &'a mut Store);
pub(crate) struct CachedOnly<'a>(pub(crate) &'a Store);

impl Fetch for Loading<'_> {
    fn fetch(&mut self, id: NodeId) -> Result<Option<&Node>> {
        self.0.get(id).map(Some)
    }
    fn after_leaf(&mut self, root: NodeId) -> Result<()> {
        self.0.evict_to_budget(root)
    }
    fn probe_uncached_leaf(&mut self, id: NodeId, key: &[u8], overriding: Option<Msn>) -> Result<LeafProbe> {
        let (v, floor) = self.0.read_partial_value(id, key, overriding)?;
        Ok(LeafProbe::Value(v, floor))
    }
    fn probe_uncached_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        msgs: &mut Vec<Msg>,
    ) -> Result<InternalProbe> {
        self.0
            .read_partial_internal(id, key, hash, msgs)
            .map(InternalProbe::Child)
    }
    fn store(&self) -> &Store {
        self.0
    }
}

impl Fetch for CachedOnly<'_> {
    fn fetch(&mut self, id: NodeId) -> Result<Option<&Node>> {
        Ok(self.0.peek(id))
    }
    fn after_leaf(&mut self, _root: NodeId) -> Result<()> {
        Ok(())
    }
    fn probe_uncached_leaf(&mut self, id: NodeId, key: &[u8], overriding: Option<Msn>) -> Result<LeafProbe> {
        if let Some((v, floor)) = self.0.partial_value(id, key, overriding) {
            return Ok(LeafProbe::Value(v, floor));
        }
        // Not in the side cache: one frame read from the file under the shared lock.
        Ok(match self.0.read_frame_value_shared(id, key, overriding)? {
            Some((v, floor)) => LeafProbe::Value(v, floor),
            None => LeafProbe::Miss,
        })
    }
    fn probe_uncached_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        msgs: &mut Vec<Msg>,
    ) -> Result<InternalProbe> {
        let before = msgs.len();
        Ok(match self.0.partial_internal_probe(id, key, hash, msgs)? {
            Some(c) => InternalProbe::Child(c),
            None => {
                msgs.truncate(before);
                InternalProbe::Miss
            }
        })
    }
    fn store(&self) -> &Store {
        self.0
    }
}
