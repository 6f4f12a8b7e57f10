//! Creating and loading the tree file: the first checkpoint, the headers, the BTT.

use super::*;

/// Writes an empty tree (one empty leaf) with a first checkpoint to a temporary file, then
/// renames it into place and syncs the directory: a crash leaves either no tree or a valid one.
pub(crate) fn create_tree_file(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &EngineOptions,
    params: TreeParams,
) -> Result<()> {
    let tmp = dir.join(TREE_TMP_NAME);
    if vfs.exists(&tmp) {
        vfs.remove_file(&tmp)
            .map_err(io(format!("remove {}", tmp.display())))?;
    }
    let file = vfs
        .open(&tmp, true)
        .map_err(io(format!("create {}", tmp.display())))?;
    let store = Store::new(
        file,
        tmp.clone(),
        opts.compression_level,
        opts.cache_size_bytes as usize,
        None,
        None,
    );
    let mut tree = Tree {
        params,
        store,
        root: 1,
        next_msn: 1,
        next_node_id: 2,
        meta: None,
        spill_stats: Default::default(),
        flusher: None,
    };
    tree.store.put(1, Node::Leaf(Leaf::default()));
    tree.checkpoint()?;
    let path = dir.join(TREE_FILE_NAME);
    vfs.rename(&tmp, &path)
        .map_err(io(format!("rename {} into place", tmp.display())))?;
    vfs.sync_dir(dir)
        .map_err(io(format!("sync dir {}", dir.display())))?;
    Ok(())
}

pub(crate) fn load_tree(
    file: Arc<dyn VfsFile>,
    path: &Path,
    opts: &EngineOptions,
    params: TreeParams,
) -> Result<Tree> {
    let mut headers: Vec<Header> = Vec::new();
    for slot in 0..2u64 {
        let mut buf = vec![0u8; HEADER_BYTES];
        let n = file
            .read_at(&mut buf, slot * HEADER_SLOT_BYTES)
            .map_err(io(format!("read header of {}", path.display())))?;
        if n < HEADER_BYTES {
            continue;
        }
        if let Some(h) = decode_header(&buf)? {
            headers.push(h);
        }
    }
    headers.sort_by_key(|h| std::cmp::Reverse(h.counter));
    let header = *headers.first().ok_or_else(|| EngineError::Corruption {
        location: format!("{} headers", path.display()),
        detail: "no valid header in either slot".into(),
    })?;
    let img = read_btt(file.as_ref(), path, &header)?;
    // The previous checkpoint's blocks stay reserved (fallback if the newest header is damaged).
    let previous = headers
        .get(1)
        .and_then(|h| read_btt(file.as_ref(), path, h).ok().map(|i| (i, h.btt)));
    let store = Store::new(
        file,
        path.to_path_buf(),
        opts.compression_level,
        opts.cache_size_bytes as usize,
        Some((&img, header.btt)),
        previous.as_ref().map(|(i, l)| (i, *l)),
    );
    let mut tree = Tree {
        params,
        store,
        root: img.root,
        next_msn: img.next_msn,
        next_node_id: img.next_node_id,
        meta: img.meta,
        spill_stats: Default::default(),
        flusher: None,
    };
    tree.store.get(tree.root)?;
    Ok(tree)
}

/// Reads and verifies the BTT block a header points at.
pub(crate) fn read_btt(file: &dyn VfsFile, path: &Path, header: &Header) -> Result<BttImage> {
    let btt_loc: BlockLoc = header.btt;
    let location = format!("{} BTT block @ offset {}", path.display(), btt_loc.offset);
    let mut buf = vec![0u8; btt_loc.size as usize];
    file.read_exact_at(&mut buf, btt_loc.offset)
        .map_err(|source| EngineError::Corruption {
            location: location.clone(),
            detail: format!("unreadable: {source}"),
        })?;
    if crc32c::crc32c(&buf) != btt_loc.crc {
        return Err(EngineError::Corruption {
            location,
            detail: "crc32c mismatch with the header".into(),
        });
    }
    let img = decode_btt(&buf, &location)?;
    if img.counter != header.counter {
        return Err(EngineError::Corruption {
            location,
            detail: format!("BTT counter {} != header counter {}", img.counter, header.counter),
        });
    }
    Ok(img)
}
