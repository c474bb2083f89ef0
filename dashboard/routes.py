"""The dashboard's routes, apart from dashboard.web: the app adds them at start without
importing the pages' module, which it loads on the first page (api.deferred)."""

# Every HTML (non-API) operation the dashboard serves. They are not in docs/openapi.yaml,
# which describes the JSON API; tests/test_openapi.py leaves exactly these out.
PAGE_ROUTES = (
    ("GET", "/", "home"),
    ("GET", "/setup/{token}", "setup"),
    ("POST", "/setup/{token}", "setup"),
    ("GET", "/invite/{token}", "invitation"),
    ("POST", "/invite/{token}", "invitation"),
    ("POST", "/sites", "site_add"),
    ("GET", "/login", "login"),
    ("POST", "/login", "login"),
    ("POST", "/logout", "logout"),
    ("GET", "/sites/{site_id}", "site"),
    ("GET", "/sites/{site_id}/live", "live"),
    ("GET", "/sites/{site_id}/revenue", "revenue"),
    ("GET", "/sites/{site_id}/funnels", "funnels"),
    ("POST", "/sites/{site_id}/funnels", "funnels"),
    ("POST", "/sites/{site_id}/funnels/delete", "funnel_delete"),
    ("GET", "/sites/{site_id}/settings", "settings"),
    ("POST", "/sites/{site_id}/settings/keys", "key_create"),
    ("POST", "/sites/{site_id}/settings/keys/{key_id}/revoke", "key_revoke"),
    ("POST", "/sites/{site_id}/settings/hosts", "host_add"),
    ("POST", "/sites/{site_id}/settings/hosts/remove", "host_remove"),
    ("POST", "/sites/{site_id}/settings/shares", "share_create"),
    ("POST", "/sites/{site_id}/settings/shares/{link_id}/revoke", "share_revoke"),
    ("GET", "/sites/{site_id}/install", "install"),
    ("GET", "/sites/{site_id}/remove", "site_remove"),
    ("POST", "/sites/{site_id}/remove", "site_remove"),
    ("GET", "/accounts/{account_id}/people", "people"),
    ("POST", "/accounts/{account_id}/invitations", "invite"),
    ("POST", "/accounts/{account_id}/invitations/{invitation_id}/revoke", "invite_revoke"),
    ("POST", "/accounts/{account_id}/members/{user_id}", "member"),
    ("GET", "/share/{token}", "share"),
    ("GET", "/share/{token}/live", "share_live"),
    ("GET", "/static/{digest}/{name:path}", "static"),
)


def add_page_routes(app, resource) -> None:
    """Every page's route to `resource`: a Dashboard, or one that stands for it."""
    seen = set()
    for _, path, suffix in PAGE_ROUTES:
        if (path, suffix) not in seen:
            seen.add((path, suffix))
            app.add_route(path, resource, suffix=suffix)


def responder_names() -> list[str]:
    """Falcon's responder name of each route, e.g. on_get_home."""
    return sorted({f"on_{method.lower()}_{suffix}" for method, _, suffix in PAGE_ROUTES})
