"""MCP servers as a clone host sees them, and the tools they give its clones (docs/mcp.md)."""
