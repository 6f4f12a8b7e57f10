//! The node's log lines (`[logging]`): `text` or `json` on stderr, every line naming the node.
//!
//! Text: `TIME LEVEL node=ID span{fields}: target: message key=value ...`. JSON, one object per
//! line: `timestamp`, `level`, `node_id`, `target`, `message`, the event's own fields at the top
//! level (a field named like one of those is written as `field.NAME`), and `spans`, the
//! enclosing spans from the root as `name{fields}` strings.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::{LogFormat, LoggingConfig};

/// Installs the process's log subscriber: `logging`'s format and level (`RUST_LOG`, when set,
/// takes precedence over the level), lines on stderr naming `node_id` (`None`: a process that
/// is no node, such as the playground's supervisor). A second call does nothing.
pub fn init(node_id: Option<u64>, logging: &LoggingConfig) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(logging.filter_directives()));
    // Colours only in text on a terminal (log files and JSON stay plain).
    use std::io::IsTerminal;
    let ansi = logging.format == LogFormat::Text && std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .event_format(NodeLogFormat {
            node_id,
            format: logging.format,
        })
        .with_writer(std::io::stderr)
        .try_init();
}

/// The [`FormatEvent`] of the node's log.
#[derive(Debug, Clone, Copy)]
pub struct NodeLogFormat {
    /// Written on every line (`node=ID`, `"node_id": ID`).
    pub node_id: Option<u64>,
    /// Text or JSON.
    pub format: LogFormat,
}

impl<S, N> FormatEvent<S, N> for NodeLogFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let spans: Vec<String> = ctx
            .event_scope()
            .into_iter()
            .flat_map(|scope| scope.from_root())
            .map(|span| {
                let extensions = span.extensions();
                match extensions.get::<FormattedFields<N>>() {
                    Some(fields) if !fields.is_empty() => format!("{}{{{}}}", span.name(), fields),
                    _ => span.name().to_string(),
                }
            })
            .collect();
        match self.format {
            LogFormat::Text => {
                write!(writer, "{timestamp} {:>5} ", meta.level())?;
                if let Some(id) = self.node_id {
                    write!(writer, "node={id} ")?;
                }
                for span in &spans {
                    write!(writer, "{span}:")?;
                }
                if !spans.is_empty() {
                    writer.write_char(' ')?;
                }
                write!(writer, "{}: ", meta.target())?;
                ctx.field_format().format_fields(writer.by_ref(), event)?;
                writeln!(writer)
            }
            LogFormat::Json => {
                let mut object = Map::new();
                object.insert("timestamp".into(), Value::String(timestamp));
                object.insert("level".into(), Value::String(meta.level().to_string()));
                object.insert("node_id".into(), self.node_id.map_or(Value::Null, Value::from));
                object.insert("target".into(), Value::String(meta.target().to_string()));
                event.record(&mut JsonFields(&mut object));
                // Every line has a message (an event of fields only has an empty one), so log
                // pipelines can rely on the schema.
                object
                    .entry("message")
                    .or_insert_with(|| Value::String(String::new()));
                if !spans.is_empty() {
                    object.insert(
                        "spans".into(),
                        Value::Array(spans.into_iter().map(Value::String).collect()),
                    );
                }
                writeln!(writer, "{}", Value::Object(object))
            }
        }
    }
}

/// Names the JSON formatter writes itself; an event field so named becomes `field.NAME`.
const RESERVED: [&str; 5] = ["timestamp", "level", "node_id", "target", "spans"];

/// Records an event's fields into a JSON object (the `message` field under `message`).
struct JsonFields<'a>(&'a mut Map<String, Value>);

impl JsonFields<'_> {
    fn insert(&mut self, field: &Field, value: Value) {
        let name = field.name();
        let key = if RESERVED.contains(&name) {
            format!("field.{name}")
        } else {
            name.to_string()
        };
        self.0.insert(key, value);
    }
}

impl Visit for JsonFields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.insert(field, Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.insert(field, Value::String(value.to_string()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field, Value::Bool(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.insert(field, Value::String(value.to_string()));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines_of(format: LogFormat, emit: impl FnOnce()) -> Vec<String> {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .event_format(NodeLogFormat {
                node_id: Some(7),
                format,
            })
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn json_lines_are_objects_with_the_node_id_message_fields_and_spans() {
        let lines = lines_of(LogFormat::Json, || {
            let span = tracing::info_span!("apply", index = 42u64);
            let _entered = span.enter();
            tracing::warn!(elapsed_ms = 1500u64, method = "Put", level = "x", "slow request");
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let v: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["node_id"], 7);
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["message"], "slow request");
        assert_eq!(v["elapsed_ms"], 1500);
        assert_eq!(v["method"], "Put");
        assert_eq!(
            v["field.level"], "x",
            "a field named like a reserved key is renamed"
        );
        assert_eq!(v["spans"][0], "apply{index=42}");
        assert!(v["timestamp"].as_str().unwrap().starts_with("20"), "{v}");
        assert!(v["target"].as_str().unwrap().contains("logging"), "{v}");
    }

    #[test]
    fn a_json_event_of_fields_only_has_an_empty_message() {
        let lines = lines_of(LogFormat::Json, || {
            tracing::info!(req = "vote");
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let v: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["message"], "", "{v}");
        assert_eq!(v["req"], "vote", "{v}");
    }

    #[test]
    fn text_lines_name_the_node() {
        let lines = lines_of(LogFormat::Text, || {
            tracing::info!(term = 3u64, "became leader");
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert!(line.contains(" INFO node=7 "), "{line}");
        assert!(line.contains("became leader term=3"), "{line}");
    }
}
