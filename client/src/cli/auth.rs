//! `ftkvctl user ...`, `role ...`, `auth ...` (etcdctl's shapes) and where the passwords come
//! from: never from a command-line argument (the process list shows those). The global
//! `--user NAME` takes its password from `--password-file FILE`, else `FTKV_PASSWORD`, else a
//! prompt when stdin is a terminal; the password of a new user (`user add`, `user passwd`) from
//! `--new-password-file FILE`, else `FTKV_NEW_PASSWORD`, else a prompt (asked twice).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde_json::json;

use super::output::Format;
use crate::{prefix_end, Client, PermType, Permission};

/// Where the new password of `user add` / `user passwd` comes from.
#[derive(Debug, clap::Args)]
pub struct NewPassword {
    /// File holding the new user's password (its first line). Else FTKV_NEW_PASSWORD, else a
    /// prompt.
    #[arg(long)]
    pub new_password_file: Option<PathBuf>,
}

/// `user ...`.
#[derive(Debug, clap::Subcommand)]
pub enum UserCommand {
    /// Add a user.
    Add {
        /// Name.
        name: String,
        /// Its password.
        #[command(flatten)]
        password: NewPassword,
    },
    /// Delete a user.
    Delete {
        /// Name.
        name: String,
    },
    /// List the users.
    List,
    /// Show a user's roles.
    Get {
        /// Name.
        name: String,
    },
    /// Give a user a role.
    GrantRole {
        /// User.
        name: String,
        /// Role.
        role: String,
    },
    /// Take a role from a user.
    RevokeRole {
        /// User.
        name: String,
        /// Role.
        role: String,
    },
    /// Change a user's password (its tokens stop working).
    Passwd {
        /// Name.
        name: String,
        /// The new password.
        #[command(flatten)]
        password: NewPassword,
    },
}

/// Permission type on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PermArg {
    /// READ.
    Read,
    /// WRITE.
    Write,
    /// READWRITE.
    Readwrite,
}

/// `role ...`.
#[derive(Debug, clap::Subcommand)]
pub enum RoleCommand {
    /// Add a role.
    Add {
        /// Name.
        name: String,
    },
    /// Delete a role (taken from every user).
    Delete {
        /// Name.
        name: String,
    },
    /// List the roles.
    List,
    /// Show a role's permissions.
    Get {
        /// Name.
        name: String,
    },
    /// Give a role a permission on KEY, on [KEY, END), or on every key with the prefix KEY
    /// (--prefix); END "\0" (or --from-key) means every key from KEY on.
    GrantPermission {
        /// Role.
        name: String,
        /// read, write or readwrite.
        #[arg(value_enum)]
        perm: PermArg,
        /// Key, or range start.
        key: String,
        /// Exclusive range end.
        end: Option<String>,
        /// Every key that starts with KEY.
        #[arg(long, conflicts_with_all = ["end", "from_key"])]
        prefix: bool,
        /// Every key from KEY on.
        #[arg(long, conflicts_with = "end")]
        from_key: bool,
    },
    /// Take the permission on exactly KEY, or KEY to END (or --prefix, --from-key), from a role.
    RevokePermission {
        /// Role.
        name: String,
        /// Key, or range start.
        key: String,
        /// Exclusive range end.
        end: Option<String>,
        /// The permission was granted with --prefix.
        #[arg(long, conflicts_with_all = ["end", "from_key"])]
        prefix: bool,
        /// The permission was granted with --from-key.
        #[arg(long, conflicts_with = "end")]
        from_key: bool,
    },
}

/// `auth ...`.
#[derive(Debug, clap::Subcommand)]
pub enum AuthCommand {
    /// Turn auth on (the user root with the role root must exist).
    Enable,
    /// Turn auth off.
    Disable,
    /// Whether auth is on.
    Status,
}

/// First line of `path` (a trailing newline is not part of the password).
fn password_from_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the password file {}", path.display()))?;
    let line = text.lines().next().unwrap_or_default().to_string();
    if line.is_empty() {
        bail!("the password file {} is empty", path.display());
    }
    Ok(line)
}

/// The password of the global `--user`: `--password-file`, `FTKV_PASSWORD`, or a prompt.
pub fn login_password(user: &str, file: Option<&Path>) -> anyhow::Result<String> {
    if let Some(path) = file {
        return password_from_file(path);
    }
    if let Ok(p) = std::env::var("FTKV_PASSWORD") {
        if !p.is_empty() {
            return Ok(p);
        }
    }
    if std::io::stdin().is_terminal() {
        return rpassword::prompt_password(format!("Password of {user}: "))
            .context("cannot read the password");
    }
    bail!("--user {user} needs a password: --password-file FILE, FTKV_PASSWORD, or a terminal to prompt on")
}

fn new_password(user: &str, args: &NewPassword) -> anyhow::Result<String> {
    if let Some(path) = &args.new_password_file {
        return password_from_file(path);
    }
    if let Ok(p) = std::env::var("FTKV_NEW_PASSWORD") {
        if !p.is_empty() {
            return Ok(p);
        }
    }
    if std::io::stdin().is_terminal() {
        let first = rpassword::prompt_password(format!("Password of {user}: "))
            .context("cannot read the password")?;
        let again = rpassword::prompt_password("Type password again for confirmation: ")
            .context("cannot read the password")?;
        if first != again {
            bail!("the two passwords differ");
        }
        return Ok(first);
    }
    bail!("the password of {user}: --new-password-file FILE, FTKV_NEW_PASSWORD, or a terminal to prompt on")
}

fn range_end(key: &[u8], end: Option<Vec<u8>>, prefix: bool, from_key: bool) -> Vec<u8> {
    if from_key {
        return vec![0];
    }
    if prefix {
        let e = prefix_end(key);
        // A prefix of nothing but 0xFF bytes (or empty) reaches the end of the keys.
        return if e.is_empty() { vec![0] } else { e };
    }
    end.unwrap_or_default()
}

fn show_range(p: &Permission, bytes: super::output::Bytes) -> String {
    match p.range_end.as_slice() {
        [] => bytes.show(&p.key),
        [0] => format!("[{}, <open ended>", bytes.show(&p.key)),
        end => format!("[{}, {})", bytes.show(&p.key), bytes.show(end)),
    }
}

fn simple_or_json(format: Format, simple: String, value: serde_json::Value) -> String {
    match format {
        Format::Json => value.to_string(),
        Format::Simple | Format::Table => simple,
    }
}

/// Runs `user ...`.
pub async fn run_user(client: &Client, format: Format, cmd: &UserCommand) -> anyhow::Result<String> {
    Ok(match cmd {
        UserCommand::Add { name, password } => {
            let password = new_password(name, password)?;
            client.user_add(name, &password).await?;
            simple_or_json(format, format!("User {name} created"), json!({"ok": true}))
        }
        UserCommand::Delete { name } => {
            client.user_delete(name).await?;
            simple_or_json(format, format!("User {name} deleted"), json!({"ok": true}))
        }
        UserCommand::List => {
            let users = client.user_list().await?;
            simple_or_json(format, users.join("\n"), json!({ "users": users }))
        }
        UserCommand::Get { name } => {
            let roles = client.user_get(name).await?;
            simple_or_json(
                format,
                format!("User: {name}\nRoles: {}", roles.join(" ")),
                json!({ "user": name, "roles": roles }),
            )
        }
        UserCommand::GrantRole { name, role } => {
            client.user_grant_role(name, role).await?;
            simple_or_json(
                format,
                format!("Role {role} is granted to user {name}"),
                json!({"ok": true}),
            )
        }
        UserCommand::RevokeRole { name, role } => {
            client.user_revoke_role(name, role).await?;
            simple_or_json(
                format,
                format!("Role {role} is revoked from user {name}"),
                json!({"ok": true}),
            )
        }
        UserCommand::Passwd { name, password } => {
            let password = new_password(name, password)?;
            client.user_change_password(name, &password).await?;
            simple_or_json(format, "Password updated".to_string(), json!({"ok": true}))
        }
    })
}

/// Runs `role ...`.
pub async fn run_role(
    client: &Client,
    format: Format,
    hex: bool,
    cmd: &RoleCommand,
) -> anyhow::Result<String> {
    let bytes = super::output::Bytes { hex };
    Ok(match cmd {
        RoleCommand::Add { name } => {
            client.role_add(name).await?;
            simple_or_json(format, format!("Role {name} created"), json!({"ok": true}))
        }
        RoleCommand::Delete { name } => {
            client.role_delete(name).await?;
            simple_or_json(format, format!("Role {name} deleted"), json!({"ok": true}))
        }
        RoleCommand::List => {
            let roles = client.role_list().await?;
            simple_or_json(format, roles.join("\n"), json!({ "roles": roles }))
        }
        RoleCommand::Get { name } => {
            let perms = client.role_get(name).await?;
            let mut simple = format!("Role {name}\nKV Read:");
            for p in perms.iter().filter(|p| p.perm_type != PermType::Write) {
                simple.push_str(&format!("\n\t{}", show_range(p, bytes)));
            }
            simple.push_str("\nKV Write:");
            for p in perms.iter().filter(|p| p.perm_type != PermType::Read) {
                simple.push_str(&format!("\n\t{}", show_range(p, bytes)));
            }
            let list: Vec<serde_json::Value> = perms
                .iter()
                .map(|p| {
                    let mut o = bytes.json_object(&[("key", &p.key), ("range_end", &p.range_end)]);
                    o.insert("perm_type".into(), json!(p.perm_type.name()));
                    serde_json::Value::Object(o)
                })
                .collect();
            simple_or_json(format, simple, json!({ "role": name, "permissions": list }))
        }
        RoleCommand::GrantPermission {
            name,
            perm,
            key,
            end,
            prefix,
            from_key,
        } => {
            let key = super::arg_bytes(key, hex, "key")?;
            let end = end
                .as_deref()
                .map(|e| super::arg_bytes(e, hex, "range end"))
                .transpose()?;
            let perm_type = match perm {
                PermArg::Read => PermType::Read,
                PermArg::Write => PermType::Write,
                PermArg::Readwrite => PermType::ReadWrite,
            };
            let range_end = range_end(&key, end, *prefix, *from_key);
            client
                .role_grant_permission(
                    name,
                    Permission {
                        perm_type,
                        key,
                        range_end,
                    },
                )
                .await?;
            simple_or_json(format, format!("Role {name} updated"), json!({"ok": true}))
        }
        RoleCommand::RevokePermission {
            name,
            key,
            end,
            prefix,
            from_key,
        } => {
            let key = super::arg_bytes(key, hex, "key")?;
            let end = end
                .as_deref()
                .map(|e| super::arg_bytes(e, hex, "range end"))
                .transpose()?;
            let range_end = range_end(&key, end, *prefix, *from_key);
            client.role_revoke_permission(name, &key, &range_end).await?;
            simple_or_json(
                format,
                format!("Permission of role {name} revoked"),
                json!({"ok": true}),
            )
        }
    })
}

/// Runs `auth ...`.
pub async fn run_auth(client: &Client, format: Format, cmd: &AuthCommand) -> anyhow::Result<String> {
    Ok(match cmd {
        AuthCommand::Enable => {
            client.auth_enable().await?;
            simple_or_json(format, "Authentication Enabled".into(), json!({"ok": true}))
        }
        AuthCommand::Disable => {
            client.auth_disable().await?;
            simple_or_json(format, "Authentication Disabled".into(), json!({"ok": true}))
        }
        AuthCommand::Status => {
            let s = client.auth_status().await?;
            simple_or_json(
                format,
                format!(
                    "Authentication Status: {}\nAuthRevision: {}",
                    s.enabled, s.revision
                ),
                json!({ "enabled": s.enabled, "auth_revision": s.revision }),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_and_from_key_range_ends() {
        assert_eq!(range_end(b"a/", None, true, false), b"a0".to_vec());
        assert_eq!(range_end(b"\xff", None, true, false), vec![0]);
        assert_eq!(range_end(b"a", None, false, true), vec![0]);
        assert_eq!(range_end(b"a", Some(b"c".to_vec()), false, false), b"c".to_vec());
        assert_eq!(range_end(b"a", None, false, false), Vec::<u8>::new());
    }
}
