"""A conversation between two named people over several dated sessions, end to end through the API: who
said what is shown in every block and found by a question naming the person, dates are shown where the day
changes and relative ones resolved, a question naming a period prefers messages from it, and hits sized by
tokens fill a large budget with short turns."""

from datetime import UTC, datetime, timedelta

import pytest

from conversations.services import conversation_create
from tests.context.helpers import context

pytestmark = pytest.mark.django_db

MAY_8 = datetime(2023, 5, 8, 18, 0, tzinfo=UTC)
JUNE_20 = datetime(2023, 6, 20, 9, 0, tzinfo=UTC)

# A small two-speaker corpus of our own making: three sessions, short turns, relative dates.
SESSIONS = [
    (
        MAY_8,
        [
            ("Priya", "Hey Tomas! How was your weekend?"),
            ("Tomas", "Pretty quiet, I mostly fixed my bike. You?"),
            ("Priya", "I went to a pottery class yesterday, it was so relaxing."),
            ("Tomas", "Haha nice, I should try that someday."),
        ],
    ),
    (
        datetime(2023, 5, 21, 17, 0, tzinfo=UTC),
        [
            ("Tomas", "Guess what, I finally built the treehouse for my nephew last weekend."),
            ("Priya", "No way! Send pictures."),
            ("Tomas", "Will do. Next month I am taking him camping too."),
        ],
    ),
    (
        JUNE_20,
        [
            ("Priya", "I started learning the cello two weeks ago."),
            ("Tomas", "That's brave, my sister plays the violin."),
        ],
    ),
]


def post_messages(owner, conversation, items: list[dict]) -> None:
    response = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/messages", {"messages": items}, format="json"
    )
    assert response.status_code == 201, response.content


def load_corpus(owner, conversation) -> None:
    for start, turns in SESSIONS:
        items = [
            {
                "role": "user" if name == "Priya" else "assistant",
                "name": name,
                "content": text,
                "created_at": (start + timedelta(minutes=n)).isoformat(),
            }
            for n, (name, text) in enumerate(turns)
        ]
        post_messages(owner, conversation, items)


def b5_text(body) -> str:
    return body["messages"][-1]["content"]


def history_text(body) -> str:
    return "\n".join(
        m["content"] for m in body["messages"][:-1] if m["role"] != "system" and isinstance(m["content"], str)
    )


def test_names_and_date_lines_are_shown_in_the_history(owner, conversation, lexical_only):
    load_corpus(owner, conversation)

    body = context(owner, conversation, user_message="What's new?", token_budget=16000)

    shown = history_text(body)
    assert "Priya: I went to a pottery class yesterday (2023-05-07), it was so relaxing." in shown
    assert "Tomas: Haha nice" in shown
    # One date line per day the history changes day, before its first turn.
    assert shown.count("[Monday, 2023-05-08]") == 1
    assert shown.count("[Sunday, 2023-05-21]") == 1
    assert shown.index("[Sunday, 2023-05-21]") < shown.index("Tomas: Guess what")


def test_participants_are_listed_with_their_counts(owner, conversation, lexical_only):
    load_corpus(owner, conversation)

    body = owner.client.get(f"/api/v1/conversations/{conversation.id}").json()

    counts = {p["name"]: p["messages"] for p in body["participants"]}
    assert counts == {"Priya": 4, "Tomas": 5}


def test_a_question_naming_a_speaker_finds_that_speakers_turn(owner, conversation, lexical_only):
    post_messages(
        owner,
        conversation,
        [
            {
                "role": "user",
                "name": "Tomas",
                "content": "I adopted a grey cat from the shelter.",
                "created_at": "2023-05-01T10:00:00Z",
            },
            {
                "role": "user",
                "name": "Priya",
                "content": "I adopted a grey cat from the shelter.",
                "created_at": "2023-05-02T10:01:00Z",
            },
            *[
                {
                    "role": "user",
                    "name": "Tomas",
                    "content": f"Unrelated small talk number {n}.",
                    "created_at": "2023-05-03T10:02:00Z",
                }
                for n in range(30)
            ],
        ],
    )

    body = context(
        owner,
        conversation,
        user_message="Which animal did Priya adopt?",
        token_budget=2000,
        retrieval={"top_k": 1},
    )

    # Both said the same words; the question names Priya, so her turn is the one placed.
    (item,) = body["blocks"]["B5"]["items"]
    assert item["seq"] == 2
    assert "· Priya] I adopted a grey cat" in b5_text(body)


def test_a_relative_date_is_shown_resolved_with_the_hit(owner, conversation, lexical_only):
    load_corpus(owner, conversation)
    post_messages(
        owner, conversation, [{"role": "user", "name": "Priya", "content": f"Filler {n}."} for n in range(60)]
    )

    when = context(
        owner, conversation, user_message="When did Priya go to the pottery class?", token_budget=1000
    )
    assert "pottery class yesterday (2023-05-07)" in b5_text(when)
    assert "2023-05-08" in b5_text(when)  # the hit's label carries the day it was said


def test_a_question_naming_a_period_prefers_messages_from_it(owner, conversation, lexical_only):
    # Two equal turns, one said in May, one in June: the question's period decides.
    post_messages(
        owner,
        conversation,
        [
            {
                "role": "user",
                "name": "Tomas",
                "content": "I tried rock climbing this week.",
                "created_at": "2023-05-10T10:00:00Z",
            },
            {
                "role": "user",
                "name": "Tomas",
                "content": "I tried rock climbing this week.",
                "created_at": "2023-06-10T10:00:00Z",
            },
            *[{"role": "user", "name": "Priya", "content": f"More filler {n}."} for n in range(30)],
        ],
    )
    body = context(
        owner,
        conversation,
        user_message="What did Tomas try in June 2023?",
        token_budget=2000,
        retrieval={"top_k": 1},
    )
    (item,) = body["blocks"]["B5"]["items"]
    assert item["created_at"].startswith("2023-06-10")


def test_short_turns_fill_a_large_budget(owner, conversation, lexical_only):
    topics = ["hiking", "cooking", "painting", "chess", "gardening", "cycling", "baking", "yoga"]
    day = datetime(2023, 3, 1, 12, tzinfo=UTC)
    items = [
        {
            "role": "user" if n % 2 == 0 else "assistant",
            "name": "Ana" if n % 2 == 0 else "Ben",
            "content": f"{'Pottery' if n % 3 else 'Weather'} note {n}: an afternoon on {topics[n % 8]}.",
            "created_at": (day + timedelta(days=n // 50, minutes=n % 50)).isoformat(),
        }
        for n in range(2000)
    ]
    for start in range(0, len(items), 100):
        post_messages(owner, conversation, items[start : start + 100])

    body = context(owner, conversation, user_message="What did Ana say about pottery?", token_budget=8000)

    assert body["tokens"]["total"] >= 0.9 * 8000
    assert body["tokens"]["total"] <= 8000
    b5 = body["blocks"]["B5"]["items"]
    days = {i["created_at"][:10] for i in b5 if i["kind"] == "message"}
    assert len(days) >= 5  # spread over sessions, not one day's hits


@pytest.mark.parametrize("name", ["x" * 65, "bell\x07", 42])
def test_a_bad_name_is_refused_and_nothing_is_stored(owner, conversation, name):
    response = owner.client.post(
        f"/api/v1/conversations/{conversation.id}/messages",
        {"messages": [{"role": "user", "content": "fine"}, {"role": "user", "name": name, "content": "bad"}]},
        format="json",
    )

    assert response.status_code == 400
    assert "invalid_name" in response.content.decode()
    assert conversation.messages.count() == 0


def test_an_outsider_sees_no_participants(owner, outsider, conversation, lexical_only):
    load_corpus(owner, conversation)

    response = outsider.client.get(f"/api/v1/conversations/{conversation.id}")

    assert response.status_code == 404
    assert "Priya" not in response.content.decode()


@pytest.mark.parametrize("asked_about", ["Tomas", "Tomas's", "James", "James'"])
def test_a_name_ending_in_s_is_recognised_with_or_without_its_possessive(asked_about):
    from retrieval.questions import asked

    participants = {"tomas": "Tomas", "james": "James", "priya": "Priya"}

    question = asked(f"What did {asked_about} cat eat?", participants)

    assert question.names == {asked_about.split("'")[0].lower()}
    assert asked_about.split("'")[0] not in question.lexical


def test_a_hit_from_another_conversation_names_its_speaker_and_resolves_its_dates(owner, lexical_only):
    earlier = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Spring chat")
    post_messages(
        owner,
        earlier,
        [
            {
                "role": "assistant",
                "name": "Tomas",
                "content": "I repaired the old sailboat yesterday.",
                "created_at": "2023-04-02T10:00:00Z",
            },
            *[{"role": "user", "name": "Priya", "content": f"Small talk {n}."} for n in range(30)],
        ],
    )
    current = conversation_create(tenant=owner.tenant, end_user_external_id="alice", title="Now")
    post_messages(
        owner, current, [{"role": "user", "name": "Priya", "content": f"Filler {n}."} for n in range(60)]
    )

    body = context(owner, current, user_message="When was the old sailboat repaired?", token_budget=2000)

    label = '[conversation "Spring chat", #1 · 2023-04-02 · Tomas]'
    assert f"{label} I repaired the old sailboat yesterday (2023-04-01)." in b5_text(body)
