"""The dashboard: server-rendered pages (Jinja2) for signed-in users and shared links.

Figures come from reports.service, the same entry the Stats API uses. Templates and
static files are package data, read through importlib.resources.
"""
