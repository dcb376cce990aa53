"""Agent toolkit: an MCP server over Verity's payments core.

A plain package (no models, not in INSTALLED_APPS): `tools.py` holds the tool logic,
`server.py` the MCP server, `views.py`/`urls.py` the streamable HTTP transport.
"""
