"""Agent toolkit: an MCP server over Verity's payments core.

An installed app without models (in INSTALLED_APPS for its `mcp_server` command): `tools.py`
holds the tool logic, `server.py` the MCP server, `views.py`/`urls.py` the streamable HTTP
transport.
"""
