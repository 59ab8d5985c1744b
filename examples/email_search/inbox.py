"""A seeded synthetic inbox, and questions whose answers are facts written into its emails.

Why synthetic: the example must run offline and in CI with no data to download, and its reward must
be exact. Every question is generated from the same fact that was written into one email, so its
answer (and the email that holds it) is known, not judged. The rest of the inbox is filler that
shares names, projects and vendors with the facts, so finding the right email takes a search.

    python examples/email_search/inbox.py inbox.sqlite questions.jsonl   # write one to look at
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path

OWNER = "Alex Morgan <alex.morgan@northwind.example>"
FIRST_NAMES = [
    "Dana", "Priya", "Marcus", "Elena", "Tomas", "Aisha", "Kenji", "Sofia", "Liam", "Nadia", "Oscar", "Grace",
    "Ravi", "Chloe", "Mateo", "Hannah", "Yusuf", "Ingrid", "Felix", "Leila", "Noah", "Mei", "Samuel", "Zara",
]  # fmt: skip
LAST_NAMES = [
    "Ortiz", "Shah", "Bell", "Novak", "Lindqvist", "Okafor", "Tanaka", "Rossi", "Walsh", "Haddad", "Brennan",
    "Kim", "Mehta", "Dubois", "Silva", "Fischer", "Aydin", "Berg", "Klein", "Nasser", "Park", "Chen", "Adler",
]  # fmt: skip
DOMAINS = ["northwind.example", "contoso.example", "fabrikam.example", "tailspin.example"]
PROJECTS = ["Falcon", "Juniper", "Atlas", "Harbor", "Quartz", "Meridian", "Cobalt", "Willow"]
MEETINGS = ["design review", "kickoff", "budget sync", "retrospective", "planning session", "demo"]
ROOMS = ["Room 4B", "the Oak room", "the Lighthouse room", "Room 12", "the library", "the 3rd floor lounge"]
VENDORS = ["Brightline Supplies", "Parcelbay", "Kestrel Outfitters", "Maple & Co", "Voltcart", "Homestead Goods"]
ITEMS = [
    "standing desk", "desk lamp", "noise-cancelling headset", "ergonomic chair", "monitor arm", "webcam",
    "mechanical keyboard", "laptop stand", "USB-C dock", "whiteboard", "coffee grinder", "rain jacket",
    "hiking boots", "water filter", "label printer", "portable charger",
]  # fmt: skip
PROVIDERS = ["Cloudnest", "Sparkle Cleaning", "Hart & Lowe Legal", "Greenleaf Catering", "Nimbus Hosting"]
SERVICES = ["hosting", "office cleaning", "legal advice", "event catering", "support plan", "data backup"]
CITIES = ["Lisbon", "Osaka", "Toronto", "Nairobi", "Oslo", "Santiago", "Dublin", "Hanoi", "Vienna", "Denver"]
FILLER_SUBJECTS = [
    "Lunch on {weekday}?", "Re: {project} notes", "Weekly newsletter", "Office plants", "Parking update",
    "Re: {project} slides", "Team photo", "Quick question about {project}", "Holiday schedule", "Book club",
]  # fmt: skip
FILLER_BODIES = [
    "Hi {owner},\n\nAnyone up for lunch at the noodle place on {weekday}? I can book a table for six.\n\n{sender}",
    "Hi {owner},\n\nI cleaned up the {project} notes from last week and put them in the shared folder. "
    "Nothing urgent, just have a look when you can.\n\n{sender}",
    "Hello all,\n\nThis week: the new coffee machine is in, the {project} team shipped a milestone and the "
    "quiz night moves to the canteen.\n\nCheers,\n{sender}",
    "Hi {owner},\n\nCould you water the plants by the window while I am away? Thanks a lot!\n\n{sender}",
    "Hi {owner},\n\nThe {project} slides look good to me. I left two small comments on the timeline.\n\n{sender}",
    "Hi {owner},\n\nDo you know who owns the {project} budget spreadsheet now? I could not find it.\n\n{sender}",
]  # fmt: skip
START = datetime(2025, 1, 6, 8, 0)
DAYS = 150  # the inbox spans about five months
VAL_SHARE = 0.2  # of the questions, held out for evaluation


@dataclass(frozen=True)
class Email:
    id: str
    date: str  # "2025-03-14 09:05"
    sender: str  # "Dana Ortiz <dana.ortiz@contoso.example>"
    to: str
    subject: str
    body: str


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str  # exactly as the email writes it
    email_id: str  # the email that holds the answer
    kind: str
    split: str  # "train" or "val"


@dataclass(frozen=True)
class Inbox:
    owner: str
    emails: list[Email]
    questions: list[Question]


@dataclass(frozen=True)
class Fact:
    """One email's content plus the question it answers; `key` must be unique so each question has one answer."""

    key: tuple[str, ...]
    sender: str
    subject: str
    body: str
    question: str
    answer: str
    kind: str


def people(rng: random.Random, count: int) -> list[str]:
    """`count` distinct "First Last <first.last@domain>" senders."""
    names = sorted({f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES})
    chosen = rng.sample(names, count)
    return [f"{name} <{name.lower().replace(' ', '.')}@{rng.choice(DOMAINS)}>" for name in chosen]


def display_name(address: str) -> str:
    return address.split(" <", 1)[0]


def company(name: str) -> str:
    """A company's no-reply sender address."""
    return f"{name} <no-reply@{''.join(ch for ch in name.lower() if ch.isalnum())}.example>"


def day_label(day: datetime) -> str:
    return f"{day:%A}, {day:%B} {day.day}"  # "Friday, March 14"


def meeting_fact(rng: random.Random, colleagues: list[str], sent: datetime) -> Fact:
    sender, project, meeting = rng.choice(colleagues), rng.choice(PROJECTS), rng.choice(MEETINGS)
    day = sent + timedelta(days=rng.randint(2, 12))
    time = f"{rng.randint(9, 17):02d}:{rng.choice(['00', '15', '30', '45'])}"
    body = (
        f"Hi {display_name(OWNER).split()[0]},\n\nThe {project} {meeting} is set for {day_label(day)} at {time} in "
        f"{rng.choice(ROOMS)}. Please bring the latest numbers.\n\nThanks,\n{display_name(sender)}"
    )
    question = f"At what time is the {project} {meeting} on {day:%B} {day.day}?"
    key = (project, meeting, day.date().isoformat())
    return Fact(key, sender, f"{project} {meeting}", body, question, time, "meeting")


def order_fact(rng: random.Random, colleagues: list[str], sent: datetime) -> Fact:
    vendor, item = rng.choice(VENDORS), rng.choice(ITEMS)
    number = f"{vendor[:2].upper()}-{rng.randint(10000, 99999)}"
    body = (
        f"Thank you for shopping with {vendor}!\n\nYour order ({item}) has shipped and should arrive within 3 business days. "
        f"Your order number is {number}; quote it if you contact us.\n\n{vendor} customer care"
    )
    question = f"What is the order number of the {item} I bought from {vendor}?"
    return Fact((vendor, item), company(vendor), f"Your {vendor} order has shipped", body, question, number, "order")


def invoice_fact(rng: random.Random, colleagues: list[str], sent: datetime) -> Fact:
    provider, service = rng.choice(PROVIDERS), rng.choice(SERVICES)
    amount = f"${rng.randint(80, 4800):,}.{rng.randint(0, 99):02d}"
    body = (
        f"Dear customer,\n\nPlease find our invoice for {service} in {sent:%B}. The total due is {amount}, "
        f"payable within 30 days.\n\nKind regards,\n{provider} billing"
    )
    question = f"How much did {provider} invoice for {service} in {sent:%B}?"
    key = (provider, service, f"{sent:%B}")
    return Fact(key, company(provider), f"Invoice from {provider}", body, question, amount, "invoice")


def flight_fact(rng: random.Random, colleagues: list[str], sent: datetime) -> Fact:
    city = rng.choice(CITIES)
    code = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
    day = sent + timedelta(days=rng.randint(7, 30))
    body = (
        f"Hello {display_name(OWNER)},\n\nYour flight to {city} on {day_label(day)} is confirmed. "
        f"Booking reference: {code}. Online check-in opens 24 hours before departure.\n\nSafe travels"
    )
    question = f"What is the booking reference of my flight to {city} on {day:%B} {day.day}?"
    subject = f"Booking confirmed: flight to {city}"
    return Fact((city, day.date().isoformat()), company("Skyway Air"), subject, body, question, code, "flight")


FACT_MAKERS: list[Callable[[random.Random, list[str], datetime], Fact]] = [
    meeting_fact,
    order_fact,
    invoice_fact,
    flight_fact,
]


def filler(rng: random.Random, sender: str, sent: datetime) -> tuple[str, str]:
    """(subject, body) of an email that answers no question."""
    fields = {
        "weekday": f"{sent + timedelta(days=rng.randint(1, 5)):%A}",
        "project": rng.choice(PROJECTS),
        "owner": display_name(OWNER).split()[0],
        "sender": display_name(sender),
    }
    return rng.choice(FILLER_SUBJECTS).format(**fields), rng.choice(FILLER_BODIES).format(**fields)


def unique_facts(rng: random.Random, colleagues: list[str], dates: dict[int, datetime]) -> dict[int, Fact]:
    """A fact for each email position in `dates` (kinds in turn), leaving out any whose key was already used."""
    facts: dict[int, Fact] = {}
    keys: set[tuple[str, ...]] = set()
    for turn, (position, sent) in enumerate(sorted(dates.items())):
        fact = FACT_MAKERS[turn % len(FACT_MAKERS)](rng, colleagues, sent)
        if fact.key not in keys:
            keys.add(fact.key)
            facts[position] = fact
    return facts


def generate_inbox(seed: int = 0, emails: int = 300, people_count: int = 36, facts: int = 120) -> Inbox:
    """The same inbox and questions for the same arguments.

    At most `facts` emails hold a fact (one whose question would have two answers is left out); about a
    fifth of the questions are held out (split "val").
    """
    if not 0 < facts <= emails:
        raise ValueError(f"facts must be between 1 and emails ({emails}), got {facts}")
    rng = random.Random(seed)
    colleagues = people(rng, people_count)
    dates = sorted(START + timedelta(minutes=rng.randint(0, DAYS * 24 * 60)) for _ in range(emails))
    written = unique_facts(rng, colleagues, {p: dates[p] for p in rng.sample(range(emails), facts)})
    inbox_emails, questions = [], []
    for position, sent in enumerate(dates):
        email_id = f"e{position + 1:04d}"
        if (fact := written.get(position)) is not None:
            sender, subject, body = fact.sender, fact.subject, fact.body
            split = "val" if rng.random() < VAL_SHARE else "train"
            question_id = f"q{len(questions) + 1:04d}"
            questions.append(Question(question_id, fact.question, fact.answer, email_id, fact.kind, split))
        else:
            sender = rng.choice(colleagues)
            subject, body = filler(rng, sender, sent)
        inbox_emails.append(Email(email_id, f"{sent:%Y-%m-%d %H:%M}", sender, OWNER, subject, body))
    return Inbox(OWNER, inbox_emails, questions)


def fts5_available() -> bool:
    try:
        sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE probe USING fts5(text)")
    except sqlite3.OperationalError:
        return False
    return True


def write_sqlite(inbox: Inbox, path: str | Path) -> Path:
    """Write the emails to a SQLite file (with an FTS5 index where SQLite has it), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".sqlite.tmp")
    os.close(handle)
    with sqlite3.connect(temporary) as db:
        db.execute(
            "CREATE TABLE emails (id TEXT PRIMARY KEY, date TEXT, sender TEXT, recipient TEXT, subject TEXT, body TEXT)"
        )
        db.executemany("INSERT INTO emails VALUES (?, ?, ?, ?, ?, ?)", [astuple(email) for email in inbox.emails])
        if fts5_available():
            db.execute("CREATE VIRTUAL TABLE emails_fts USING fts5(id UNINDEXED, subject, sender, body)")
            db.execute("INSERT INTO emails_fts SELECT id, subject, sender, body FROM emails")
    db.close()
    os.replace(temporary, path)
    return path


def astuple(email: Email) -> tuple[str, ...]:
    return (email.id, email.date, email.sender, email.to, email.subject, email.body)


def write_questions(questions: list[Question], path: str | Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(asdict(q)) + "\n" for q in questions), encoding="utf-8")
    return path


def read_questions(path: str | Path) -> list[Question]:
    return [Question(**json.loads(line)) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("database", help="the SQLite file to write")
    parser.add_argument("questions", help="the JSONL file of questions to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    inbox = generate_inbox(args.seed)
    write_sqlite(inbox, args.database)
    write_questions(inbox.questions, args.questions)
    print(f"{len(inbox.emails)} emails, {len(inbox.questions)} questions -> {args.database}, {args.questions}")


if __name__ == "__main__":
    main()
