"""An MCP server (stdio) over one inbox in SQLite: `search_emails` and `read_email`, the agent's only tools.

Why MCP: the agent reaches the inbox the way it would reach any real mailbox service, and the
art-agents MCP session records each call in the rollout's trajectory. Read-only, so one server
process can serve every rollout (`MCPServer(..., shared=True)`).

    python examples/email_search/mcp_server.py inbox.sqlite      # or EMAIL_SEARCH_DB=inbox.sqlite
"""

from __future__ import annotations

from art_agents.extras import exit_unless_installed

exit_unless_installed("examples/email_search/mcp_server.py", "mcp")  # before any import of them

import os
import re
import sqlite3
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

DB_ENV = "EMAIL_SEARCH_DB"
MAX_LIMIT = 20
INSTRUCTIONS = (
    "The user's mailbox. search_emails finds emails by keywords (best matches first) and gives their ids; "
    "read_email gives one email in full."
)

server = MCPServer("email-search", instructions=INSTRUCTIONS, log_level="WARNING")


def database_path() -> Path:
    """The SQLite file: the first argument, else $EMAIL_SEARCH_DB."""
    given = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(DB_ENV)
    if not given:
        raise SystemExit(f"usage: mcp_server.py INBOX.sqlite (or set {DB_ENV})")
    path = Path(given)
    if not path.is_file():
        raise SystemExit(f"no inbox at {path}; write one with inbox.py or train.py")
    return path


def connect() -> sqlite3.Connection:
    db = sqlite3.connect(f"file:{database_path()}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    return db


def keywords(query: str) -> list[str]:
    """The words of a query; FTS5 syntax (quotes, operators, columns) is never passed through."""
    return re.findall(r"\w+", query.lower())


def has_fts(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'emails_fts'").fetchone() is not None


def fts_search(db: sqlite3.Connection, words: list[str], limit: int) -> list[sqlite3.Row]:
    """Emails matching any of the words, best first by BM25 (more and rarer words rank higher)."""
    match = " OR ".join(f'"{word}"' for word in words)
    return db.execute(
        "SELECT e.id, e.date, e.sender, e.subject, snippet(emails_fts, 3, '', '', ' ... ', 16) AS snippet "
        "FROM emails_fts JOIN emails e ON e.id = emails_fts.id WHERE emails_fts MATCH ? "
        "ORDER BY bm25(emails_fts) LIMIT ?",
        (match, limit),
    ).fetchall()


def like_search(db: sqlite3.Connection, words: list[str], limit: int) -> list[sqlite3.Row]:
    """Without FTS5: emails ranked by how many of the words they contain."""
    text = "lower(subject || ' ' || sender || ' ' || body)"
    hits = " + ".join(f"({text} LIKE ?)" for _ in words)
    return db.execute(
        f"SELECT id, date, sender, subject, substr(body, 1, 160) AS snippet, {hits} AS hits FROM emails "
        "WHERE hits > 0 ORDER BY hits DESC, date LIMIT ?",
        [*(f"%{word}%" for word in words), limit],
    ).fetchall()


@server.tool()
def search_emails(query: str, limit: int = 5) -> list[dict[str, Any]]:
    """Search the inbox by keywords (subject, sender, body). Returns up to `limit` matches, best first,
    each with its id, date, sender, subject and a snippet; read one with read_email."""
    words = keywords(query)
    if not words:
        raise ToolError("the query has no words; search with keywords such as a name, a project or a vendor")
    limit = max(1, min(limit, MAX_LIMIT))
    with closing(connect()) as db:
        rows = fts_search(db, words, limit) if has_fts(db) else like_search(db, words, limit)
    return [
        {
            "id": row["id"],
            "date": row["date"],
            "from": row["sender"],
            "subject": row["subject"],
            "snippet": row["snippet"],
        }
        for row in rows
    ]


@server.tool()
def read_email(email_id: str) -> str:
    """Read one email in full, by the id search_emails gave (such as e0042)."""
    with closing(connect()) as db:
        row = db.execute("SELECT * FROM emails WHERE id = ?", (email_id.strip(),)).fetchone()
    if row is None:
        raise ToolError(f"no email with id {email_id!r}; ids look like e0042 and come from search_emails")
    return f"From: {row['sender']}\nTo: {row['recipient']}\nDate: {row['date']}\nSubject: {row['subject']}\n\n{row['body']}"


if __name__ == "__main__":
    database_path()  # refuse to start without an inbox, rather than fail on the first call
    server.run()
