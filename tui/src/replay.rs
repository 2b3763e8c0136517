//! Feed recorded server lines (hello, the subscribe reply, pushes) into an [`App`]:
//! how the tests drive the views with a recorded session.

use jet_proto::{Hello, Snapshot};

use crate::app::{App, ConnState};
use crate::client::{parse_incoming, Incoming};

/// Apply one line as the console would; an error for a line it would not understand.
pub fn feed_line(app: &mut App, line: &str) -> Result<(), String> {
    if let Ok(h) = serde_json::from_str::<Hello>(line) {
        app.conn = ConnState::Connected {
            server: h.hello.server,
        };
        return Ok(());
    }
    match parse_incoming(line) {
        Incoming::Reply(r) if r.ok => {
            let s: Snapshot =
                serde_json::from_value(r.result.unwrap_or_default()).map_err(|e| e.to_string())?;
            app.apply_snapshot(s);
            Ok(())
        }
        Incoming::Reply(r) => Err(format!("error reply: {:?}", r.error)),
        Incoming::Push(p) => {
            app.apply_push(p);
            Ok(())
        }
        Incoming::Bad(e) => Err(e),
        Incoming::Closed(_) => Ok(()),
    }
}

/// Apply every non-empty line of `text`.
pub fn replay(app: &mut App, text: &str) -> Result<(), String> {
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        feed_line(app, line).map_err(|e| format!("line {}: {e}", i + 1))?;
    }
    Ok(())
}
