//! The small TOML files in a data dir that say what it belongs to (`node.toml`: the node,
//! `cluster.toml`: the cluster): read with their format version checked, written durably
//! (temporary file fsynced, renamed, directory fsynced).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::ClusterError;

/// Reads `data_dir/name` (`Ok(None)` when absent); a file that does not parse, or whose
/// `format_version` (as `version_of` reads it) is not `expected_version`, is refused.
pub(crate) fn read<T: DeserializeOwned>(
    data_dir: &Path,
    name: &str,
    expected_version: u32,
    version_of: impl Fn(&T) -> u32,
) -> Result<Option<T>, ClusterError> {
    let path = data_dir.join(name);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ClusterError::Storage(format!(
                "cannot read {}: {e}",
                path.display()
            )))
        }
    };
    let value: T = toml::from_str(&text)
        .map_err(|e| ClusterError::Storage(format!("{} is corrupt: {e}", path.display())))?;
    let version = version_of(&value);
    if version != expected_version {
        return Err(ClusterError::Storage(format!(
            "{} has format version {version}, this build reads {expected_version}",
            path.display()
        )));
    }
    Ok(Some(value))
}

/// Writes `value` to `data_dir/name` durably, after the comment line `header`.
pub(crate) fn write<T: Serialize>(
    data_dir: &Path,
    name: &str,
    header: &str,
    value: &T,
) -> std::io::Result<()> {
    use std::io::Write;
    let text = toml::to_string(value).map_err(|e| std::io::Error::other(e.to_string()))?;
    let tmp = data_dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "# {header}")?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, data_dir.join(name))?;
    std::fs::File::open(data_dir)?.sync_all()
}
