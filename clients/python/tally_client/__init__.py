"""tally_client: send events and payments to a Tally server from a Python backend.

    from tally_client import Tally
    tally = Tally("https://tally.example.com", key="tly_...", site="site_...")
    tally.pageview("https://example.com/pricing", ip=ip, ua=ua)
    tally.payment({...})
"""

from tally_client.client import Tally, TallyError
from tally_client.web import client_ip, identity_hash, visitor_id_from_cookies

__all__ = ["Tally", "TallyError", "client_ip", "identity_hash", "visitor_id_from_cookies"]
__version__ = "0.1.0"
