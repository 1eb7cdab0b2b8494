"""The operator console's pages against a real PostgreSQL, as a browser uses
them: a cookie jar, forms with their CSRF token, the Origin and
Sec-Fetch-Site headers a browser sends; sessions, a proxy's identities, a
forged cross-site POST, a read-only role's pages, the ingress path prefix."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from yarl import URL

from outbox import new_message
from outbox.postgres import PostgresStore
from outbox.service.ui import Access, Console, Proxy, TokenFile
from outbox.service.ui.access import COOKIE, SESSION_LIFETIME
from outbox.store import TopicSettings
from tests.clock import T0
from tests.integration.test_console import OPERATOR, VIEWER, bury, tokens_file

CSRF = re.compile(r'name="csrf" value="([^"]*)"')
CHANGES = re.compile(r"<button[^>]*>\s*(Requeue|Purge|Pause|Resume|Reveal|Release|Override)")


class Browser:
    """A cookie jar and the headers a same-origin browser sends."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def get(self, path: str, **headers: str) -> tuple[int, str]:
        async with self.session.get(self.base + path, headers=headers, allow_redirects=False) as r:
            return r.status, await r.text() if r.status != 303 else r.headers["Location"]

    async def post(
        self, path: str, form: dict[str, Any], *, site: str | None = "same-origin", **headers: str
    ) -> tuple[int, str]:
        sent = dict(headers)
        if site is not None:
            sent.setdefault("Sec-Fetch-Site", site)
        async with self.session.post(
            self.base + path, data=form, headers=sent, allow_redirects=False
        ) as r:
            return r.status, await r.text() if r.status != 303 else r.headers["Location"]

    async def sign_in(self, token: str) -> None:
        status, where = await self.post("/signin", {"token": token, "next": "/"})
        assert (status, where) == (303, "/")

    async def csrf(self, path: str = "/") -> str:
        status, page = await self.get(path)
        assert status == 200, page
        return str(CSRF.findall(page)[0])


@pytest.fixture
async def served(pg_store: PostgresStore, tmp_path: Path) -> AsyncIterator[Browser]:
    app = Console(pg_store, TokenFile(tokens_file(tmp_path / "tokens"))).app()
    async with (
        TestServer(app, host="127.0.0.1") as server,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session,
    ):
        yield Browser(session, str(server.make_url("")).rstrip("/"))


async def test_a_browser_signs_in_with_a_token_and_out_again(
    pg_store: PostgresStore, tmp_path: Path
) -> None:
    tokens = tokens_file(tmp_path / "tokens")
    now = [T0.timestamp()]
    access = Access(TokenFile(tokens), session_key=b"k" * 32, clock=lambda: now[0])
    app = Console(pg_store, access=access).app()
    async with (
        TestServer(app, host="127.0.0.1") as server,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session,
    ):
        browser = Browser(session, str(server.make_url("")).rstrip("/"))
        assert await browser.get("/buried?topic=a") == (303, "/signin?next=/buried?topic%3Da")
        status, page = await browser.post("/signin", {"token": "not-a-token-at-all"})
        assert status == 401
        assert "not one of the tokens file" in page

        async with session.post(
            browser.base + "/signin",
            data={"token": OPERATOR, "next": "/buried?topic=a"},
            headers={"Sec-Fetch-Site": "same-origin"},
            allow_redirects=False,
        ) as r:
            assert (r.status, r.headers["Location"]) == (303, "/buried?topic=a")
            cookie = r.headers["Set-Cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert f"Max-Age={SESSION_LIFETIME}" in cookie
        assert "Secure" not in cookie, "plain HTTP on loopback: a Secure cookie would be lost"
        assert OPERATOR not in cookie, "the cookie is no token"
        status, page = await browser.get("/")
        assert status == 200
        assert "olu · operator" in page
        value = session.cookie_jar.filter_cookies(URL(browser.base))[COOKIE].value

        # Signing out ends the session: its cookie, sent again, signs nobody in.
        status, where = await browser.post("/signout", {"csrf": await browser.csrf()})
        assert (status, where) == (303, "/signin")
        assert COOKIE not in session.cookie_jar.filter_cookies(URL(browser.base))
        async with session.get(
            browser.base + "/", cookies={COOKIE: value}, allow_redirects=False
        ) as r:
            assert r.status == 303

        # A session lasts at most twelve hours.
        await browser.sign_in(VIEWER)
        assert (await browser.get("/"))[0] == 200
        now[0] += SESSION_LIFETIME + 1
        assert (await browser.get("/"))[0] == 303

        # A token taken out of the file (a rotated Secret) ends its sessions.
        now[0] = T0.timestamp()
        await browser.sign_in(VIEWER)
        assert (await browser.get("/"))[0] == 200
        tokens.write_text(f"olu operator {OPERATOR}\nana viewer rotated-viewer-token-000\n")
        assert (await browser.get("/"))[0] == 303


async def test_a_forged_cross_site_post_changes_nothing(
    served: Browser, pg_store: PostgresStore
) -> None:
    await pg_store.set_topic(TopicSettings("mail.welcome"))
    await served.sign_in(OPERATOR)
    csrf = await served.csrf("/topics")

    # Another site's form, posted by the signed-in browser (SameSite aside).
    status, page = await served.post(
        "/topics/mail.welcome/pause", {"csrf": csrf}, site="cross-site"
    )
    assert status == 403
    assert "cross-site" in page
    # A browser that sends no Sec-Fetch-Site: its Origin decides.
    status, _ = await served.post(
        "/topics/mail.welcome/pause", {"csrf": csrf}, site=None, Origin="https://evil.example"
    )
    assert status == 403
    # Same-origin without the session's token, or with another's.
    assert (await served.post("/topics/mail.welcome/pause", {}))[0] == 403
    assert (await served.post("/topics/mail.welcome/pause", {"csrf": "0" * 32}))[0] == 403
    # The API, reached with the cookie instead of a bearer token, asks the same.
    async with served.session.post(
        served.base + "/api/v1/topics/mail.welcome/pause", headers={"Sec-Fetch-Site": "same-origin"}
    ) as r:
        assert r.status == 403
    assert (await pg_store.topics())["mail.welcome"].enabled, "nothing changed"

    status, where = await served.post("/topics/mail.welcome/pause", {"csrf": csrf})
    assert status == 303
    assert where.startswith("/topics?notice=")
    assert not (await pg_store.topics())["mail.welcome"].enabled
    origin = served.base
    status, _ = await served.post(
        "/topics/mail.welcome/resume", {"csrf": csrf}, site=None, Origin=origin
    )
    assert status == 303
    assert (await pg_store.topics())["mail.welcome"].enabled


async def test_a_viewer_sees_no_change_and_no_payload(
    served: Browser, pg_store: PostgresStore
) -> None:
    buried = new_message(
        "mail.welcome", {"code": "918273"}, T0, key="u-1", headers={"x-tenant": "acme-secret"}
    )
    await bury(pg_store, buried, reason="550 mailbox gone")
    await pg_store.set_topic(TopicSettings("mail.welcome"))
    await served.sign_in(VIEWER)
    pages = [
        "/",
        "/messages",
        "/messages?state=buried",
        f"/messages/{buried.id}",
        "/buried",
        "/keys",
        "/relays",
        "/topics",
    ]
    for path in pages:
        status, page = await served.get(path)
        assert status == 200, (path, page)
        assert "918273" not in page
        assert "acme-secret" not in page, "header values are an operator's"
        assert not CHANGES.search(page), (path, CHANGES.findall(page))
    status, page = await served.get(f"/messages/{buried.id}")
    assert "x-tenant" in page, "a viewer sees header names"
    assert "550 mailbox gone" in page
    csrf = CSRF.findall(page)[0]
    assert (await served.post(f"/messages/{buried.id}/reveal", {"csrf": csrf}))[0] == 403
    form = {"csrf": csrf, "action": "requeue", "all": "1"}
    assert (await served.post("/buried/confirm", form))[0] == 403
    assert len(await pg_store.list_buried()) == 1


async def test_an_operator_requeues_all_that_match_after_the_count(
    served: Browser, pg_store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    timeouts = [new_message("hook.order", {"n": n}, T0) for n in range(4)]
    await bury(pg_store, *timeouts, reason="receiver timed out after 10s")
    other = new_message("hook.order", {"n": 9}, T0)
    await bury(pg_store, other, reason="400 bad request")
    await served.sign_in(OPERATOR)

    status, page = await served.get("/buried?topic=hook.order&error_contains=TIMED+OUT")
    assert status == 200
    assert page.count('<tr data-id="') == 4
    csrf = CSRF.findall(page)[0]
    form = {
        "csrf": csrf,
        "action": "requeue",
        "topic": "hook.order",
        "error_contains": "TIMED OUT",
        "all": "1",
    }
    status, page = await served.post("/buried/confirm", form)
    assert status == 200
    assert "Requeue 4 buried messages?" in page
    confirm = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page))
    assert confirm["buried_by"]
    # Buried after the count: the confirmed action leaves it alone.
    late = new_message("hook.order", {"n": 10}, T0)
    async with pg_store.begin() as tx:
        await pg_store.add(tx, late)
    await pg_store.bury(late.id, "receiver timed out after 10s")
    with caplog.at_level("INFO", logger="outbox.ui.audit"):
        status, where = await served.post("/buried/act", confirm)
    assert status == 303
    assert "Requeued+4+messages" in where
    left = {s.message.id for s in await pg_store.list_buried()}
    assert left == {other.id, late.id}
    [line] = [r.getMessage() for r in caplog.records if r.name == "outbox.ui.audit"]
    assert line == "olu (operator) requeue: topic=hook.order filter=error_contains,topic count=4"
    assert "TIMED" not in line

    # The selected ones: ids checked on the page.
    status, page = await served.post(
        "/buried/confirm", {"csrf": csrf, "action": "purge", "ids": str(other.id)}
    )
    assert "Purge 1 buried message?" in page
    confirm = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page))
    assert (await served.post("/buried/act", confirm))[0] == 303
    assert {s.message.id for s in await pg_store.list_buried()} == {late.id}
    # Nothing selected and no filter: refused, not everything.
    assert (await served.post("/buried/confirm", {"csrf": csrf, "action": "purge"}))[0] == 400


async def test_an_operator_reveals_a_payload_and_the_reveal_is_audited(
    pg_store: PostgresStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    m = new_message("mail.welcome", {"code": "918273"}, T0, headers={"traceparent": traceparent})
    async with pg_store.begin() as tx:
        await pg_store.add(tx, m)
    app = Console(
        pg_store,
        TokenFile(tokens_file(tmp_path / "tokens")),
        trace_url="https://tempo.example/trace/{trace_id}",
    ).app()
    async with (
        TestServer(app, host="127.0.0.1") as server,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session,
    ):
        browser = Browser(session, str(server.make_url("")).rstrip("/"))
        await browser.sign_in(OPERATOR)
        status, page = await browser.get(f"/messages/{m.id}")
        assert "918273" not in page, "hidden until revealed"
        assert 'href="https://tempo.example/trace/0af7651916cd43dd8448eb211c80319c"' in page
        with caplog.at_level("INFO", logger="outbox.ui.audit"):
            status, page = await browser.post(
                f"/messages/{m.id}/reveal", {"csrf": CSRF.findall(page)[0]}
            )
    assert status == 200
    assert "918273" in page
    [line] = [r.getMessage() for r in caplog.records if r.name == "outbox.ui.audit"]
    assert line == f"olu (operator) reveal: topic=mail.welcome message={m.id}"


async def test_a_governed_topic_is_paused_only_by_an_override_that_can_be_released(
    served: Browser, pg_store: PostgresStore
) -> None:
    await pg_store.set_topic(TopicSettings("mail.welcome", source="kubernetes:mail/welcome"))
    await served.sign_in(OPERATOR)
    csrf = await served.csrf("/topics")
    status, page = await served.post("/topics/mail.welcome/pause", {"csrf": csrf})
    assert status == 409
    assert "OutboxTopic mail/welcome" in page
    assert "kubectl -n mail patch outboxtopic welcome" in page
    assert (await pg_store.topics())["mail.welcome"].enabled

    status, _ = await served.post("/topics/mail.welcome/pause?force=1", {"csrf": csrf})
    assert status == 303
    entry = (await pg_store.topics())["mail.welcome"]
    assert (entry.enabled, entry.source) == (False, "cli")
    status, page = await served.get("/topics")
    assert "an operator's entry" in page
    assert ">Release</button>" in page
    assert (await served.post("/topics/mail.welcome/release", {"csrf": csrf}))[0] == 303
    assert "mail.welcome" not in await pg_store.topics()


async def test_the_overview_says_when_its_counts_are_stale_and_counts_once_on_request(
    served: Browser, pg_store: PostgresStore
) -> None:
    await bury(pg_store, new_message("mail.welcome", {}, T0), reason="550")
    await served.sign_in(VIEWER)
    status, page = await served.get("/")
    assert status == 200
    assert "These counts are missing" in page, "no relay has measured: nothing is counted"
    assert 'data-topic="mail.welcome"' not in page
    _, page = await served.get("/?count=1")
    assert "counted now, on request" in page
    assert 'data-topic="mail.welcome"' in page
    # The count is shared (kept) as a relay's is: the next page reads it.
    _, page = await served.get("/")
    assert "These counts are" not in page
    assert 'data-topic="mail.welcome"' in page
    assert "set <code>OUTBOX_UI_PROMETHEUS_URL</code>" in page


async def test_a_proxy_is_believed_only_from_its_addresses_and_its_groups_give_roles(
    pg_store: PostgresStore,
) -> None:
    await pg_store.set_topic(TopicSettings("mail.welcome"))

    def console(networks: str) -> Console:
        proxy = Proxy(
            (ipaddress.ip_network(networks),),
            operators=frozenset({"sre"}),
            viewers=frozenset({"dev"}),
        )
        return Console(pg_store, access=Access(None, proxy=proxy))

    async with (
        TestServer(console("127.0.0.0/8").app(), host="127.0.0.1") as server,
        aiohttp.ClientSession() as session,
    ):
        browser = Browser(session, str(server.make_url("")).rstrip("/"))
        as_sre = {"X-Forwarded-User": "kim@example.com", "X-Forwarded-Groups": "dev,sre"}
        status, page = await browser.get("/topics", **as_sre)
        assert "kim@example.com · operator" in page
        csrf = CSRF.findall(page)[0]
        assert (await browser.post("/topics/mail.welcome/pause", {"csrf": csrf}, **as_sre))[
            0
        ] == 303
        status, page = await browser.get(
            "/", **{"X-Forwarded-User": "lee", "X-Forwarded-Groups": "dev"}
        )
        assert "lee · viewer" in page
        status, page = await browser.get(
            "/", **{"X-Forwarded-User": "max", "X-Forwarded-Groups": "sales"}
        )
        assert status == 403
        async with session.get(browser.base + "/api/v1/topics") as r:
            assert r.status == 401, "nobody signed in: the proxy sent no user"

    untrusted = {"X-Forwarded-User": "kim", "X-Forwarded-Groups": "sre"}
    async with (
        TestServer(console("10.0.0.0/8").app(), host="127.0.0.1") as server,
        aiohttp.ClientSession() as session,
        session.get(str(server.make_url("/api/v1/topics")), headers=untrusted) as r,
    ):
        assert r.status == 401, "headers from an untrusted address are nobody's"


async def test_behind_an_ingress_prefix_every_link_and_the_cookie_carry_it(
    pg_store: PostgresStore, tmp_path: Path
) -> None:
    await pg_store.set_topic(TopicSettings("mail.welcome"))
    app = Console(pg_store, TokenFile(tokens_file(tmp_path / "tokens")), base="/outbox").app()
    async with (
        TestServer(app, host="127.0.0.1") as server,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session,
    ):
        root = str(server.make_url("")).rstrip("/")
        browser = Browser(session, root + "/outbox")
        assert (await Browser(session, root).get("/healthz"))[0] == 200
        assert (await browser.get("/healthz"))[0] == 200
        assert await browser.get("/") == (303, "/outbox/signin?next=/outbox/")
        async with session.post(
            root + "/outbox/signin",
            data={"token": VIEWER, "next": "/outbox/topics"},
            headers={"Sec-Fetch-Site": "same-origin"},
            allow_redirects=False,
        ) as r:
            assert r.headers["Location"] == "/outbox/topics"
            assert "Path=/outbox/" in r.headers["Set-Cookie"]
        status, page = await browser.get("/topics")
        assert status == 200
        links = re.findall(r'(?:href|action|src)="(/[^"]*)"', page)
        assert links
        assert all(link.startswith("/outbox/") for link in links), links


async def test_x_forwarded_proto_is_believed_from_the_proxy_only(
    pg_store: PostgresStore, tmp_path: Path
) -> None:
    tokens = TokenFile(tokens_file(tmp_path / "tokens"))

    async def cookie(networks: str) -> str:
        proxy = Proxy((ipaddress.ip_network(networks),), viewers=frozenset({"*"}))
        app = Console(pg_store, access=Access(tokens, proxy=proxy)).app()
        headers = {"X-Forwarded-Proto": "https", "Sec-Fetch-Site": "same-origin"}
        async with (
            TestServer(app, host="127.0.0.1") as server,
            aiohttp.ClientSession() as s,
            s.post(
                server.make_url("/signin"),
                data={"token": VIEWER},
                headers=headers,
                allow_redirects=False,
            ) as r,
        ):
            return str(r.headers["Set-Cookie"])

    assert "Secure" in await cookie("127.0.0.1/32")
    assert "Secure" not in await cookie("10.0.0.0/8")


def test_sessions_are_refused_when_forged_or_tampered(tmp_path: Path) -> None:
    tokens = TokenFile(tokens_file(tmp_path / "tokens"))
    access = Access(tokens, session_key=b"a" * 32)
    signed = access.sign_in(OPERATOR)
    assert signed is not None
    _, value = signed
    body, _, signature = value.rpartition(".")
    assert access._session(value) is not None
    assert access._session(f"{body}.{'0' * len(signature)}") is None
    assert Access(tokens, session_key=b"b" * 32)._session(value) is None, "another key's"
    assert access._session(body[:-2] + "xx." + signature) is None
    assert access.sign_in("operator-token-012345678") is None
