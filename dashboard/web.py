"""The dashboard's routes: sign-in, the pages of a user's sites, settings, shared links,
and static files. HTML answers carry a strict Content-Security-Policy (no inline script)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime

import falcon
import orjson

from api.bodies import read_limited
from api.client_ip import address_block, client_ip
from api.funnels import checked_funnel
from dashboard import filters as filter_text
from dashboard import passwords
from dashboard.figures import Reports, dashboard_figures, primary_currency
from dashboard.periods import PERIODS, Period, resolve
from dashboard.render import render, static_file
from quota.usage import account_usage, month_of
from reports.money.amounts import dumps
from reports.service import too_expensive
from reports.shared.params import InvalidReportParameter, utc_today
from storage.db import Database, ReadBudgetExceeded
from storage.directory import Directory, InvalidArgument, NotFound, SiteRecord
from storage.funnels import Funnels
from storage.maintenance import delete_site
from storage.people import ROLES, People, SetupClosed
from storage.reads import ReadPool, ReadsBusy
from storage.shares import SharedLinks
from storage.site_settings import SiteSettings
from storage.users import SignedIn, Users, normalize_email
from vocabulary import SCOPES

SESSION_COOKIE = "tally_session"
LOGIN_CSRF_COOKIE = "tally_login_csrf"
SESSION_SECONDS = 14 * 86_400
# Failed sign-ins within the window that refuse further tries: for one email from one
# client address block (IPv4 address, IPv6 /64); from one block for any emails; and, a
# gentler limit, for one email from anywhere, which never refuses the blocks the user
# signed in from within KNOWN_ADDRESS_DAYS. So no attacker's address locks the owner out.
FAILED_LOGIN_LIMIT = 10
FAILED_LOGIN_ADDRESS_LIMIT = 30
FAILED_LOGIN_EMAIL_LIMIT = 100
FAILED_LOGIN_WINDOW_MS = 15 * 60 * 1000
KNOWN_ADDRESS_DAYS = 90
LOGIN_CSRF_SECONDS = 3600
FORM_LIMIT = 16 * 1024
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
STATIC_MAX_AGE = 365 * 86_400
REVENUE_DIMENSIONS = ("channel", "source", "medium", "campaign", "term", "content", "referrer",
                      "landing_page", "country", "device", "browser", "os", "plan")


def _token(random_bytes: Callable[[int], bytes]) -> str:
    return base64.urlsafe_b64encode(random_bytes(32)).decode("ascii").rstrip("=")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def _html(resp, body: str, status: int = 200, *, private: bool = True) -> None:
    resp.status = status
    resp.content_type = "text/html; charset=utf-8"
    resp.text = body
    resp.set_header("Content-Security-Policy", CSP)
    resp.set_header("X-Content-Type-Options", "nosniff")
    resp.set_header("Referrer-Policy", "no-referrer")
    resp.set_header("Cache-Control", "no-store" if private else "no-cache")


def _redirect(resp, location: str) -> None:
    resp.status = 303
    resp.location = location
    resp.set_header("Cache-Control", "no-store")


def _local_path(target: str | None) -> str:
    """`next=` only ever leads back into this site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


class Dashboard:
    def __init__(self, *, config, db: Database, directory: Directory,
                 clock: Callable[[], float], random_bytes: Callable[[int], bytes],
                 reads: ReadPool, anonymous_reads: ReadPool):
        self.db = db
        # Where a page's reports run, all in one read budget: a user's, or a shared link's.
        self.reads = reads
        self.anonymous_reads = anonymous_reads
        self.directory = directory
        self.clock = clock
        self.random_bytes = random_bytes
        self.public_url = config.public_url
        self.secure_cookies = config.public_url.startswith("https://")
        self.trusted_proxies = config.trusted_proxies
        self.users = Users(db, clock, random_bytes)
        self.shares = SharedLinks(db, clock, random_bytes)
        self.site_settings = SiteSettings(db)
        self.people = People(db, clock, random_bytes)
        self.funnels = Funnels(db, clock)

    # sessions and forms ----------------------------------------------------
    def _session(self, req) -> SignedIn | None:
        token = req.cookies.get(SESSION_COOKIE)
        if not token or len(token) > 100:
            return None
        return self.users.find_session(_digest(token))

    def _cookie(self, resp, name: str, value: str, max_age: int) -> None:
        resp.set_cookie(name, value, max_age=max_age, path="/", secure=self.secure_cookies,
                        http_only=True, same_site="Lax")

    def _form(self, req) -> dict[str, list[str]]:
        kind = (req.content_type or "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            return {}
        body = read_limited(req, FORM_LIMIT).decode("utf-8", "replace")
        return urllib.parse.parse_qs(body, keep_blank_values=True)

    @staticmethod
    def _field(form: dict[str, list[str]], name: str) -> str:
        values = form.get(name) or [""]
        return values[0]

    def _csrf_ok(self, form, expected: str | None) -> bool:
        given = self._field(form, "csrf")
        return bool(expected and given) and secrets.compare_digest(given.encode(), expected.encode())

    def _refuse_csrf(self, resp, user: SignedIn | None = None) -> None:
        _html(resp, render("message.html", title="Form expired", user=user,
                           message="This form is missing its security token or it has expired. "
                                   "Go back, reload the page and try again."), 403)

    def _read(self, resp, read: Callable[..., object], user: SignedIn | None, back: str,
              *args):
        """(True, read(db, *args)) run by the reads within the budget; or (False, None)
        with the page written that says why there are no figures."""
        try:
            return True, (self.reads if user else self.anonymous_reads).call(read, *args)
        except ReadBudgetExceeded as exc:
            text = too_expensive(exc.seconds)
            _html(resp, render("message.html", title="Too much to count", user=user,
                               message=text[0].upper() + text[1:] + ".", back=back,
                               back_text="Back to the last 30 days, unfiltered"), 422)
        except ReadsBusy:
            resp.set_header("Retry-After", "2")
            _html(resp, render("message.html", title="Busy", user=user,
                               message="Tally is busy counting other reports. Reload the page"
                                       " in a few seconds.", back=None), 503)
        return False, None

    def _signed_in_or_redirect(self, req, resp) -> SignedIn | None:
        user = self._session(req)
        if user is None:
            _redirect(resp, "/login?" + urllib.parse.urlencode({"next": req.relative_uri}))
        return user

    def _own_site(self, req, resp, site_id: str, *,
                  manage: bool = False) -> tuple[SignedIn, SiteRecord] | None:
        """The signed-in user and the site, or an answer already written (login, 404, or
        403 when `manage` and the user's role there is viewer)."""
        user = self._signed_in_or_redirect(req, resp)
        if user is None:
            return None
        site = self.directory.find_site(site_id)
        if site is None or site.account_id not in user.account_ids:
            # Another account's site looks exactly like one that does not exist.
            _html(resp, render("message.html", title="Not found", user=user,
                               message="There is no such site among yours."), 404)
            return None
        if manage and not user.manages(site.account_id):
            self._refuse_role(resp, user, f"/sites/{site_id}")
            return None
        return user, site

    def _refuse_role(self, resp, user: SignedIn, back: str = "/") -> None:
        _html(resp, render("message.html", title="Not allowed", user=user, back=back,
                           back_text="Back to the dashboard",
                           message="Your role in this account lets you read its dashboards "
                                   "only. An owner of the account can change that."), 403)

    def _own_account(self, req, resp, account_id: str) -> tuple[SignedIn, dict] | None:
        """The signed-in owner and the account (row_id, id, name), or the answer written:
        404 when the user is not a member, 403 when not an owner."""
        user = self._signed_in_or_redirect(req, resp)
        if user is None:
            return None
        account = next((a for a in self.users.accounts_of(user.account_ids)
                        if a["id"] == account_id), None)
        if account is None:
            _html(resp, render("message.html", title="Not found", user=user,
                               message="There is no such account among yours."), 404)
            return None
        if user.role_in(account["row_id"]) != "owner":
            self._refuse_role(resp, user)
            return None
        return user, account

    # sign-in -----------------------------------------------------------------
    def on_get_login(self, req, resp):
        if self._session(req) is not None:
            return _redirect(resp, _local_path(req.get_param("next")))
        self._login_page(resp, req.get_param("next") or "", "", None, 200)

    def _login_page(self, resp, next_path: str, email: str, error: str | None, status: int):
        _html(resp, render("login.html", csrf=self._anonymous_csrf(resp), next=next_path,
                           email=email, error=error), status)

    def _anonymous_csrf(self, resp) -> str:
        """The token of a form shown without a session (sign-in, setup, invitation), with
        its cookie set."""
        nonce = f"{int(self.clock())}.{_token(self.random_bytes)}"
        self._cookie(resp, LOGIN_CSRF_COOKIE, nonce, LOGIN_CSRF_SECONDS)
        return self._login_csrf(nonce)

    def _login_csrf(self, nonce: str) -> str:
        """The sign-in form's token: an HMAC of its cookie's nonce under the installation's
        key, so no one who can only write cookies can make a pair that passes."""
        mac = hmac.new(self.users.sign_in_key(), b"sign-in\0" + nonce.encode("utf-8"),
                       hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode("ascii").rstrip("=")

    def _login_csrf_ok(self, req, form) -> bool:
        nonce = req.cookies.get(LOGIN_CSRF_COOKIE)
        if not nonce or len(nonce) > 100:
            return False
        issued, _, _ = nonce.partition(".")
        if not issued.isdigit() or not 0 <= self.clock() - int(issued) <= LOGIN_CSRF_SECONDS:
            return False
        return self._csrf_ok(form, self._login_csrf(nonce))

    def on_post_login(self, req, resp):
        form = self._form(req)
        next_path = self._field(form, "next")
        if not self._login_csrf_ok(req, form):
            return self._refuse_csrf(resp)
        typed = self._field(form, "email").strip()
        password = self._field(form, "password")
        try:
            email = normalize_email(typed)
        except InvalidArgument:
            email = typed.lower()[:254]
        ip = client_ip(req.remote_addr, req.get_header("X-Forwarded-For"), self.trusted_proxies)
        address = address_block(ip) if ip is not None else "unknown"
        now_ms = int(self.clock() * 1000)
        user = self.users.find_user(email) if "@" in email else None
        wait_ms = self._locked_for(email, address, user, now_ms)
        if wait_ms:
            wait_s = max(1, (wait_ms + 999) // 1000)
            resp.set_header("Retry-After", str(wait_s))
            minutes = max(1, (wait_s + 59) // 60)
            return self._login_page(
                resp, next_path, typed,
                f"Too many failed sign-ins for this email or from this address. "
                f"Try again in {minutes} minute{'s' if minutes != 1 else ''}.", 429)
        if user is None:
            passwords.spend_like_verify(password)
            ok = False
        else:
            ok = passwords.verify(user.password_hash, password)
        if not ok:
            self.users.record_failure(email, address)
            return self._login_page(resp, next_path, typed, "Wrong email or password.", 401)
        self.users.clear_failures(email, address)
        self.users.remember_address(user.id, address, now_ms - KNOWN_ADDRESS_DAYS * 86_400_000)
        if passwords.needs_rehash(user.password_hash):
            self.users.replace_hash(user.id, user.password_hash, passwords.hasher().hash(password))
        self._start_session(resp, user.id)
        _redirect(resp, _local_path(next_path))

    def _start_session(self, resp, user_id: int) -> None:
        token = _token(self.random_bytes)
        self.users.start_session(user_id, _digest(token), _token(self.random_bytes),
                                 SESSION_SECONDS * 1000)
        self._cookie(resp, SESSION_COOKIE, token, SESSION_SECONDS)
        resp.unset_cookie(LOGIN_CSRF_COOKIE, path="/")

    def _locked_for(self, email: str, address: str, user, now_ms: int) -> int:
        """Milliseconds until this email may be tried from this address again; 0: now."""
        since = now_ms - FAILED_LOGIN_WINDOW_MS
        failures = self.users.failures_since(email, address, since)
        limits = [(failures.pair, FAILED_LOGIN_LIMIT),
                  (failures.address, FAILED_LOGIN_ADDRESS_LIMIT)]
        if failures.email[0] >= FAILED_LOGIN_EMAIL_LIMIT and not (
                user is not None and self.users.known_address(
                    user.id, address, now_ms - KNOWN_ADDRESS_DAYS * 86_400_000)):
            limits.append((failures.email, FAILED_LOGIN_EMAIL_LIMIT))
        waits = [first + FAILED_LOGIN_WINDOW_MS - now_ms
                 for (count, first), limit in limits if count >= limit and first is not None]
        return max(waits, default=0)

    def on_post_logout(self, req, resp):
        user = self._session(req)
        form = self._form(req)
        if user is not None:
            if not self._csrf_ok(form, user.csrf_token):
                return self._refuse_csrf(resp, user)
            self.users.end_session(_digest(req.cookies[SESSION_COOKIE]))
        resp.unset_cookie(SESSION_COOKIE, path="/")
        _redirect(resp, "/login")

    # pages -------------------------------------------------------------------
    def on_get_home(self, req, resp):
        if self._session(req) is None and not self.people.has_users():
            return _html(resp, render("welcome.html", user=None, title="Welcome"))
        user = self._signed_in_or_redirect(req, resp)
        if user is None:
            return
        now = self.clock()
        period = resolve({"period": "30d"}, utc_today(now))
        sites = self.users.sites_of(user.account_ids)
        try:
            figures = self.reads.call(_sites_figures, [site["row_id"] for site in sites], now,
                                      period)
            for site, its_figures in zip(sites, figures, strict=True):
                site.update(its_figures)
        except (ReadBudgetExceeded, ReadsBusy):
            pass  # the list, without the figures there was no time for
        self._home_page(resp, user, sites)

    def _home_page(self, resp, user: SignedIn, sites: list[dict], *, error: str | None = None,
                   host: str = "", status: int = 200) -> None:
        for site in sites:
            for name in ("visitors", "currency", "net"):
                site.setdefault(name, None)
        accounts = [{**account, "role": user.role_in(account["row_id"])}
                    for account in self.users.accounts_of(user.account_ids)]
        _html(resp, render("home.html", user=user, sites=sites, title="Your sites",
                           accounts=accounts, error=error, host=host,
                           managed=[a for a in accounts if a["role"] in ("owner", "admin")]),
              status)

    def _view(self, req, period_query: dict) -> tuple[Period | None, str | None]:
        try:
            return resolve(period_query, utc_today(self.clock())), None
        except InvalidReportParameter as exc:
            return resolve({}, utc_today(self.clock())), str(exc)

    def _query(self, req) -> dict[str, str]:
        return {k: req.get_param(k) or "" for k in ("period", "from", "to", "filters", "goal")}

    def _dashboard(self, req, resp, *, site: SiteRecord, user: SignedIn | None, base: str,
                   revenue: bool, shared: bool):
        query = self._query(req)
        period, error = self._view(req, query)
        # An anonymous viewer's filters are counted live (or read if stored), never stored.
        done, answer = self._read(resp, _dashboard_figures, user, base, site.id, self.clock(),
                                  not shared, period, query["filters"], query["goal"], revenue)
        if not done:
            return
        figures, refused, missing, live = answer
        if refused:
            query["filters"] = query["goal"] = ""
        error = refused or error
        body = render("dashboard.html", user=user, site=site, base=base, shared=shared,
                      revenue=revenue, period=period, periods=PERIODS, query=query,
                      error=error, figures=figures, missing=missing, live=live,
                      chart_json=_chart_json(figures, revenue),
                      active_filters=filter_text.split(query["filters"]),
                      without=filter_text.without,
                      link=_linker(base, query), filter_link=_filter_linker(base, query),
                      title=", ".join(sorted(site.hosts)) or site.public_id)
        _html(resp, body, 400 if error else 200)

    def on_get_site(self, req, resp, site_id):
        own = self._own_site(req, resp, site_id)
        if own is not None:
            self._dashboard(req, resp, site=own[1], user=own[0], base=f"/sites/{site_id}",
                            revenue=True, shared=False)

    def on_get_share(self, req, resp, token):
        link = self.shares.find(token) if len(token) <= 100 else None
        site = self.directory.find_site(link.site_public_id) if link else None
        if site is None:
            return _html(resp, render("message.html", title="Not found", user=None,
                                      message="This shared link does not exist or was revoked."),
                         404)
        self._dashboard(req, resp, site=site, user=None, base=f"/share/{token}",
                        revenue=link.revenue, shared=True)

    def _live(self, resp, site_id: int, reads: ReadPool):
        try:
            data = reads.call(_realtime, site_id, self.clock())
        except (ReadBudgetExceeded, ReadsBusy) as exc:
            resp.status = 422 if isinstance(exc, ReadBudgetExceeded) else 503
            resp.content_type = "application/json"
            resp.set_header("Cache-Control", "no-store")
            resp.data = orjson.dumps({"visitors": None})
            return
        resp.status = 200 if data is not None else 404
        resp.content_type = "application/json"
        resp.set_header("Cache-Control", "no-store")
        resp.data = orjson.dumps({"visitors": (data or {}).get("visitors")})

    def on_get_live(self, req, resp, site_id):
        user = self._session(req)
        site = self.directory.find_site(site_id)
        if user is None or site is None or site.account_id not in user.account_ids:
            resp.status = 404
            resp.content_type = "application/json"
            resp.data = orjson.dumps({"visitors": None})
            return
        self._live(resp, site.id, self.reads)

    def on_get_share_live(self, req, resp, token):
        link = self.shares.find(token) if len(token) <= 100 else None
        if link is None:
            resp.status = 404
            resp.content_type = "application/json"
            resp.data = orjson.dumps({"visitors": None})
            return
        self._live(resp, link.site_id, self.anonymous_reads)

    def on_get_revenue(self, req, resp, site_id):
        own = self._own_site(req, resp, site_id)
        if own is None:
            return
        user, site = own
        query = self._query(req)
        if not query["period"] and not query["from"] and not query["to"]:
            query["period"] = "12mo"
        period, error = self._view(req, query)
        by = req.get_param("by") or "channel"
        if by not in REVENUE_DIMENSIONS:
            by, error = "channel", error or f"by: must be one of {', '.join(REVENUE_DIMENSIONS)}"
        query["by"] = "" if by == "channel" else by
        done, answer = self._read(resp, _revenue_figures, user, f"/sites/{site_id}/revenue",
                                  site.id, self.clock(), period, query["by"])
        if not done:
            return
        mrr, movements, revenue, missing = answer
        by_supported = BY_ANY_DIMENSION not in missing
        if not by_supported:
            by = "channel"
        currencies = sorted(set((mrr or {}).get("currencies", {}))
                            | set((revenue or {}).get("currencies", {}))
                            | set((movements or {}).get("currencies", {})))
        main = primary_currency(mrr, revenue) or (currencies[0] if currencies else None)
        chosen = req.get_param("currency") or main
        if chosen not in currencies:
            chosen = main
        query["currency"] = "" if chosen == main else chosen
        months = (movements or {}).get("currencies", {}).get(chosen, {}).get("months", [])
        body = render("revenue.html", user=user, site=site, base=f"/sites/{site_id}",
                      period=period, periods=PERIODS, query=query, error=error,
                      currencies=currencies, currency=chosen,
                      mrr=(mrr or {}).get("currencies", {}).get(chosen),
                      movements=months,
                      movements_json=_script_json({"currency": chosen, "months": months}),
                      revenue=(revenue or {}).get("currencies", {}).get(chosen),
                      revenue_rows=_revenue_rows((revenue or {}).get("currencies", {}).get(chosen),
                                                 by),
                      revenue_by=by, revenue_by_label=by.replace("_", " "),
                      dimensions=REVENUE_DIMENSIONS if by_supported else (),
                      missing=missing, link=_linker(f"/sites/{site_id}/revenue", query),
                      title="Revenue · " + (", ".join(sorted(site.hosts)) or site.public_id))
        _html(resp, body, 400 if error else 200)

    # funnels -----------------------------------------------------------------
    def on_get_funnels(self, req, resp, site_id):
        own = self._own_site(req, resp, site_id)
        if own is not None:
            self._funnels_page(req, resp, *own)

    def _funnels_page(self, req, resp, user, site, *, form: dict | None = None,
                      error: str | None = None, status: int = 200):
        query = {**self._query(req), "goal": "", "funnel": req.get_param("funnel") or "",
                 "steps": req.get_param("steps") or ""}
        period, period_error = self._view(req, query)
        stored = self.funnels.list(site.id)
        if not query["funnel"] and not query["steps"] and stored:
            query["funnel"] = stored[0]["name"]
        base = f"/sites/{site.public_id}"
        done, answer = self._read(resp, _funnel_figures, user, base + "/funnels", site.id,
                                  self.clock(), period, query)
        if not done:
            return
        data, refused = answer
        error = error or refused or period_error
        funnel = None if data is None else {
            "name": data.get("funnel"), "filters": data.get("filters"), "steps": data["steps"],
            "revenue": data.get("revenue")}
        body = render("funnels.html", user=user, site=site, base=base, period=period,
                      periods=PERIODS, query=query, error=error, funnel=funnel, stored=stored,
                      form=form or {"name": "", "steps": ""}, step_label=_step_label,
                      link=_linker(base + "/funnels", query),
                      title="Funnels · " + (", ".join(sorted(site.hosts)) or site.public_id))
        _html(resp, body, 400 if error and status == 200 else status)

    def on_post_funnels(self, req, resp, site_id):
        checked = self._settings_post(req, resp, site_id)
        if checked is None:
            return
        user, site, form = checked
        typed = {"name": self._field(form, "name"), "steps": self._field(form, "steps")}
        steps = [s.strip() for line in typed["steps"].splitlines() for s in line.split(",")]
        try:
            name, steps = checked_funnel({"name": typed["name"], "steps": [s for s in steps if s]})
            self.funnels.save(site.id, name, steps)
        except (InvalidReportParameter, InvalidArgument) as exc:
            return self._funnels_page(req, resp, user, site, form=typed, error=str(exc),
                                      status=400)
        _redirect(resp, f"/sites/{site_id}/funnels?" + urllib.parse.urlencode({"funnel": name}))

    def on_post_funnel_delete(self, req, resp, site_id):
        checked = self._settings_post(req, resp, site_id)
        if checked is None:
            return
        user, site, form = checked
        if not self.funnels.delete(site.id, self._field(form, "name")):
            return _html(resp, render("message.html", title="Not found", user=user,
                                      message="This site has no such funnel."), 404)
        _redirect(resp, f"/sites/{site_id}/funnels")

    # settings ----------------------------------------------------------------
    def _settings_page(self, req, resp, user, site, *, new_key: dict | None = None,
                       new_share: str | None = None, error: str | None = None,
                       status: int = 200):
        last = self.site_settings.last_event(site.id)
        origin = self._origin(req)
        usage = account_usage(self.db, site.account_public_id, month_of(self.clock()))
        body = render(
            "settings.html", user=user, site=site, base=f"/sites/{site.public_id}",
            snippet=f'<script defer src="{origin}/js/tally.js" data-site="{site.public_id}">'
                    f"</script>",
            last_event=None if last is None else {
                "at": datetime.fromtimestamp(last[0] / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "name": last[1], "url": last[2]},
            hosts=sorted(site.hosts), keys=self.directory.list_keys(site.public_id),
            scopes=SCOPES, new_key=new_key, error=error, usage=usage,
            shares=[link for link in self.shares.list(site.public_id) if not link["revoked"]],
            new_share=new_share, welcome=req.get_param("welcome") == "1",
            title="Settings · " + (", ".join(sorted(site.hosts)) or site.public_id))
        _html(resp, body, status)

    def _origin(self, req) -> str:
        return self.public_url or f"{req.scheme}://{req.host}" + (
            f":{req.port}" if req.port not in (80, 443) else "")

    def on_get_settings(self, req, resp, site_id):
        own = self._own_site(req, resp, site_id, manage=True)
        if own is not None:
            self._settings_page(req, resp, *own)

    def on_get_install(self, req, resp, site_id):
        """The install check the settings page polls: whether any event is stored yet."""
        user = self._session(req)
        site = self.directory.find_site(site_id)
        resp.content_type = "application/json"
        resp.set_header("Cache-Control", "no-store")
        if user is None or site is None or not user.manages(site.account_id):
            resp.status = 404
            resp.data = orjson.dumps({"install": None})
            return
        receiving = self.site_settings.has_events(site.id)
        resp.data = orjson.dumps({"install": "receiving" if receiving else "waiting"})

    def _settings_post(self, req, resp, site_id):
        """(user, site, form) of a checked settings form, or None with the answer written."""
        return self._checked_form(req, resp, self._own_site(req, resp, site_id, manage=True))

    def _checked_form(self, req, resp, own):
        """(user, site or account, form) when `own` was found and the form's CSRF token is
        the user's; None with the answer written otherwise."""
        if own is None:
            return None
        form = self._form(req)
        if not self._csrf_ok(form, own[0].csrf_token):
            self._refuse_csrf(resp, own[0])
            return None
        return own[0], own[1], form

    def on_post_key_create(self, req, resp, site_id):
        checked = self._settings_post(req, resp, site_id)
        if checked is None:
            return
        user, site, form = checked
        scopes = [s for s in form.get("scope", []) if s in SCOPES]
        if not scopes:
            return self._settings_page(req, resp, user, site, status=400,
                                       error="Choose at least one scope for the new key.")
        key = self.directory.create_key(site.public_id, scopes)
        self._settings_page(req, resp, user, site, new_key=key, status=201)

    def on_post_key_revoke(self, req, resp, site_id, key_id):
        checked = self._settings_post(req, resp, site_id)
        if checked is None:
            return
        user, site, _ = checked
        if key_id not in {k["id"] for k in self.directory.list_keys(site.public_id)}:
            return _html(resp, render("message.html", title="Not found", user=user,
                                      message="This site has no such key."), 404)
        self.directory.revoke_key(key_id)
        _redirect(resp, f"/sites/{site_id}/settings#keys")

    def on_post_host_add(self, req, resp, site_id):
        self._change_host(req, resp, site_id, self.site_settings.add_host)

    def on_post_host_remove(self, req, resp, site_id):
        self._change_host(req, resp, site_id, self.site_settings.remove_host)

    def _change_host(self, req, resp, site_id, change):
        checked = self._settings_post(req, resp, site_id)
        if checked is None:
            return
        user, site, form = checked
        try:
            change(site.id, self._field(form, "host"))
        except InvalidArgument as exc:
            return self._settings_page(req, resp, user, site, error=str(exc), status=400)
        _redirect(resp, f"/sites/{site_id}/settings#hosts")

    def on_post_share_create(self, req, resp, site_id):
        checked = self._settings_post(req, resp, site_id)
        if checked is None:
            return
        user, site, form = checked
        link = self.shares.create(site.public_id, self._field(form, "revenue") == "1")
        self._settings_page(req, resp, user, site, status=201,
                            new_share=f"{self._origin(req)}/share/{link['token']}")

    def on_post_share_revoke(self, req, resp, site_id, link_id):
        checked = self._settings_post(req, resp, site_id)
        if checked is None:
            return
        user, site, _ = checked
        if link_id not in {link["id"] for link in self.shares.list(site.public_id)}:
            return _html(resp, render("message.html", title="Not found", user=user,
                                      message="This site has no such shared link."), 404)
        self.shares.revoke(link_id)
        _redirect(resp, f"/sites/{site_id}/settings#shares")

    # sites ---------------------------------------------------------------------
    def on_post_site_add(self, req, resp):
        user = self._signed_in_or_redirect(req, resp)
        if user is None:
            return
        form = self._form(req)
        if not self._csrf_ok(form, user.csrf_token):
            return self._refuse_csrf(resp, user)
        accounts = {a["id"]: a for a in self.users.accounts_of(user.account_ids)
                    if user.manages(a["row_id"])}
        if not accounts:
            return self._refuse_role(resp, user)
        chosen = self._field(form, "account") or next(iter(accounts))
        if chosen not in accounts:
            return _html(resp, render("message.html", title="Not found", user=user,
                                      message="There is no such account among yours."), 404)
        host = self._field(form, "host")
        try:
            site = self.directory.create_site(chosen, [host])
        except InvalidArgument as exc:
            return self._home_page(resp, user, self.users.sites_of(user.account_ids),
                                   error=str(exc), host=host, status=400)
        _redirect(resp, f"/sites/{site['id']}/settings?welcome=1")

    def on_get_site_remove(self, req, resp, site_id):
        own = self._own_site(req, resp, site_id, manage=True)
        if own is not None:
            self._remove_page(resp, *own)

    def _remove_page(self, resp, user, site, error: str | None = None, status: int = 200):
        _html(resp, render("remove_site.html", user=user, site=site, base=f"/sites/{site.public_id}",
                           hosts=sorted(site.hosts), error=error,
                           title="Remove · " + (", ".join(sorted(site.hosts)) or site.public_id)),
              status)

    def on_post_site_remove(self, req, resp, site_id):
        checked = self._settings_post(req, resp, site_id)
        if checked is None:
            return
        user, site, form = checked
        typed = self._field(form, "confirm").strip().lower()
        if typed not in site.hosts and typed != site.public_id:
            return self._remove_page(resp, user, site, status=400,
                                     error="Type the site's hostname exactly to confirm.")
        delete_site(self.db, site.id)
        _redirect(resp, "/")

    # first run and invitations ----------------------------------------------------------
    def on_get_setup(self, req, resp, token):
        if not self._setup_open(resp, token):
            return
        self._setup_page(resp, token, {}, None, 200)

    def _setup_open(self, resp, token: str) -> bool:
        if len(token) <= 100 and self.people.setup_open(token):
            return True
        message = ("This installation is set up already: sign in." if self.people.has_users()
                   else "This setup link has expired or is not valid. Run tally setup-link on "
                        "the server for a new one.")
        _html(resp, render("message.html", title="Setup link not valid", user=None,
                           message=message, back="/login", back_text="Sign in"), 404)
        return False

    def _setup_page(self, resp, token: str, values: dict, error: str | None, status: int):
        _html(resp, render("setup.html", user=None, title="Set up Tally", token=token,
                           csrf=self._anonymous_csrf(resp), values=values, error=error), status)

    def on_post_setup(self, req, resp, token):
        form = self._form(req)
        if not self._login_csrf_ok(req, form):
            return self._refuse_csrf(resp)
        if not self._setup_open(resp, token):
            return
        values = {name: self._field(form, name).strip() for name in ("email", "host", "account")}
        password = self._field(form, "password")
        try:
            passwords.check_strength(password)
            done = self.people.complete_setup(
                token, email=values["email"], host=values["host"],
                account_name=values["account"], password_hash=passwords.hash_password(password))
        except (passwords.WeakPassword, InvalidArgument) as exc:
            return self._setup_page(resp, token, values, _sentence(exc), 400)
        except SetupClosed:
            return self._setup_open(resp, "")
        self._start_session(resp, done["user_id"])
        _redirect(resp, f"/sites/{done['site']}/settings?welcome=1")

    def on_get_invitation(self, req, resp, token):
        invitation = self._invitation(resp, token)
        if invitation is not None:
            self._invitation_page(req, resp, token, invitation, "", None, 200)

    def _invitation(self, resp, token: str):
        invitation = self.people.find_invitation(token) if len(token) <= 100 else None
        if invitation is None:
            _html(resp, render("message.html", title="Invitation not valid", user=None,
                               message="This invitation was used, revoked or has expired. Ask "
                                       "the account's owner for a new link."), 404)
        return invitation

    def _invitation_page(self, req, resp, token, invitation, email, error, status):
        user = self._session(req)
        _html(resp, render("invitation.html", user=user, invitation=invitation, token=token,
                           csrf=user.csrf_token if user else self._anonymous_csrf(resp),
                           member=user is not None and invitation.account_id in user.account_ids,
                           email=email, error=error, title="Invitation"), status)

    def on_post_invitation(self, req, resp, token):
        user = self._session(req)
        form = self._form(req)
        if not (self._csrf_ok(form, user.csrf_token) if user else self._login_csrf_ok(req, form)):
            return self._refuse_csrf(resp, user)
        invitation = self._invitation(resp, token)
        if invitation is None:
            return
        if user is not None:
            self.people.accept(token, user_id=user.user_id)
            return _redirect(resp, "/")
        email, password = self._field(form, "email").strip(), self._field(form, "password")
        try:
            passwords.check_strength(password)
            accepted = self.people.accept(token, email=email,
                                          password_hash=passwords.hash_password(password))
        except (passwords.WeakPassword, InvalidArgument) as exc:
            return self._invitation_page(req, resp, token, invitation, email, _sentence(exc), 400)
        if accepted is None:
            return self._invitation(resp, "")
        self._start_session(resp, accepted[1])
        _redirect(resp, "/")

    # people of an account (owners) ----------------------------------------------------------
    def on_get_people(self, req, resp, account_id):
        own = self._own_account(req, resp, account_id)
        if own is not None:
            self._people_page(req, resp, *own)

    def _people_page(self, req, resp, user, account, *, new_link: dict | None = None,
                     error: str | None = None, status: int = 200):
        _html(resp, render("people.html", user=user, account=account, roles=ROLES,
                           members=self.people.members(account["row_id"]),
                           invitations=self.people.pending(account["row_id"]),
                           new_link=new_link, error=error,
                           title="People · " + account["name"]), status)

    def _account_post(self, req, resp, account_id):
        return self._checked_form(req, resp, self._own_account(req, resp, account_id))

    def on_post_invite(self, req, resp, account_id):
        checked = self._account_post(req, resp, account_id)
        if checked is None:
            return
        user, account, form = checked
        role = self._field(form, "role")
        if role not in ROLES:
            return self._people_page(req, resp, user, account, status=400,
                                     error="Choose a role: owner, admin or viewer.")
        invitation = self.people.invite(account["row_id"], role, user.user_id)
        link = {**invitation, "url": f"{self._origin(req)}/invite/{invitation['token']}"}
        self._people_page(req, resp, user, account, new_link=link, status=201)

    def on_post_invite_revoke(self, req, resp, account_id, invitation_id):
        checked = self._account_post(req, resp, account_id)
        if checked is None:
            return
        user, account, _ = checked
        if not self.people.revoke_invitation(account["row_id"], invitation_id):
            return _html(resp, render("message.html", title="Not found", user=user,
                                      message="This account has no such open invitation."), 404)
        _redirect(resp, f"/accounts/{account_id}/people#invitations")

    def on_post_member(self, req, resp, account_id, user_id):
        """A member's new role (field role), or their removal (field role = remove)."""
        checked = self._account_post(req, resp, account_id)
        if checked is None:
            return
        user, account, form = checked
        role = self._field(form, "role")
        try:
            if role == "remove":
                self.people.remove_member(account["row_id"], user_id)
            else:
                self.people.set_role(account["row_id"], user_id, role)
        except NotFound:
            return _html(resp, render("message.html", title="Not found", user=user,
                                      message="This account has no such member."), 404)
        except InvalidArgument as exc:
            return self._people_page(req, resp, user, account, error=_sentence(exc), status=400)
        after = self._session(req)  # an owner may have demoted or removed themselves
        still_owner = after is not None and after.role_in(account["row_id"]) == "owner"
        _redirect(resp, f"/accounts/{account_id}/people#members" if still_owner else "/")

    # static files ------------------------------------------------------------
    def on_get_static(self, req, resp, digest, name):
        try:
            data, current, kind = static_file(name)
        except (KeyError, FileNotFoundError):
            raise falcon.HTTPNotFound() from None
        if digest != current:
            # An old page asking for an old version: send the current one, briefly cached.
            resp.set_header("Cache-Control", "no-cache")
        else:
            resp.set_header("Cache-Control", f"public, max-age={STATIC_MAX_AGE}, immutable")
        resp.content_type = kind
        resp.set_header("X-Content-Type-Options", "nosniff")
        resp.data = data


# The reads of the pages: called with the Database first by the reads (storage/reads.py,
# storage/read_processes.py), possibly in another process, so plain data in and out.
def _sites_figures(db, site_ids: list[int], now: float, period: Period) -> list[dict]:
    answers = []
    for site_id in site_ids:
        reports = Reports(db, site_id, now)
        traffic = reports.get("aggregate", period.params()) or {}
        revenue = reports.get("revenue", period.params())
        currency = primary_currency(revenue)
        answers.append({"visitors": traffic.get("visitors"), "currency": currency,
                        "net": revenue["currencies"][currency]["net"] if currency else None})
    return answers


def _dashboard_figures(db, site_id: int, now: float, stores_segments: bool, period: Period,
                       filters: str, goal: str, revenue: bool):
    """(figures, the filters' error or None, the reports missing, realtime or not); an
    anonymous viewer's filters are counted live (or read if stored), never stored."""
    reports = Reports(db, site_id, now, stores_segments=stores_segments)
    try:
        figures, refused = dashboard_figures(reports, period, filters=filters, goal=goal,
                                             revenue=revenue), None
    except InvalidReportParameter as exc:
        figures, refused = dashboard_figures(reports, period, filters="", goal="",
                                             revenue=revenue), str(exc)
    live = reports.has("realtime")
    if not live:
        reports._note("the realtime report (visitors in the last 5 minutes)")
    return figures, refused, reports.missing, live


BY_ANY_DIMENSION = "revenue by any first-touch dimension (by=)"


def _revenue_figures(db, site_id: int, now: float, period: Period, by: str):
    """(mrr, movements, revenue, the reports missing)."""
    reports = Reports(db, site_id, now)
    return (reports.get("mrr", {"at": period.end.isoformat()}),
            reports.get("movements", period.params()),
            reports.get("revenue", {**period.params(), "by": by}, what=BY_ANY_DIMENSION),
            reports.missing)


def _funnel_figures(db, site_id: int, now: float, period: Period,
                    query: dict) -> tuple[dict | None, str | None]:
    if not query["funnel"] and not query["steps"]:
        return None, None
    params = {**period.params(), "filters": query["filters"], "funnel": query["funnel"],
              "steps": query["steps"]}
    try:
        return Reports(db, site_id, now).get("funnel", params), None
    except InvalidReportParameter as exc:
        return None, str(exc)


def _realtime(db, site_id: int, now: float) -> dict | None:
    reports = Reports(db, site_id, now)
    return reports.get("realtime", {}) if reports.has("realtime") else None


def _sentence(exc: Exception) -> str:
    text = str(exc)
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _chart_json(figures: dict, revenue: bool) -> str | None:
    series = figures.get("series")
    if not series or not series.get("rows"):
        return None
    currency = figures.get("currency")
    rows = series["rows"]
    points = {"interval": series["interval"], "currency": currency if revenue else None,
              "t": [], "visitors": [], "revenue": []}
    for row in rows:
        points["t"].append(_bucket_seconds(row))
        points["visitors"].append(row.get("visitors", 0))
        if revenue and currency:
            money = (row.get("currencies") or row.get("revenue") or {}).get(currency) or {}
            net = money.get("net") if isinstance(money, dict) else money
            points["revenue"].append(float(net or 0))
    return _script_json(points)


def _step_label(step: str) -> str:
    """page:/pricing -> Page /pricing; goal:Signup -> Goal Signup; payment -> Payment."""
    kind, _, value = step.partition(":")
    return f"{kind.capitalize()} {value}".strip()


def _script_json(payload) -> str:
    """JSON for a <script type="application/json"> block: "<" is escaped so no text can
    close it; money (Decimal) is written as an exact number."""
    return dumps(payload).decode().replace("<", "\\u003c")


def _revenue_rows(entry: dict | None, by: str) -> list[dict]:
    if not entry:
        return []
    rows = entry.get("rows") or entry.get("by_channel") or []
    return [{**row, "name": row.get(by, row.get("value", row.get("channel")))} for row in rows]


def _bucket_seconds(row: dict) -> int:
    text = str(row.get("start") or row.get("date") or row.get("bucket") or row.get("from"))
    if len(text) == 10:
        text += "T00:00:00+00:00"
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def _linker(base: str, query: dict[str, str]):
    """link(period=..., filters=...): this page's URL with some query values replaced."""
    def link(**changes) -> str:
        values = {**query, **changes}
        if values.get("period") != "custom" and "period" in changes:
            values["from"] = values["to"] = ""
        kept = {k: v for k, v in values.items() if v}
        return base + ("?" + urllib.parse.urlencode(kept) if kept else "")
    return link


def _filter_linker(base: str, query: dict[str, str]):
    link = _linker(base, query)

    def filter_link(dimension: str, value: str | None) -> str | None:
        if value is None:
            return None
        return link(filters=filter_text.with_filter(query.get("filters", ""), dimension, value))
    return filter_link


