"""How people and agents reach modulelens: the CLI, IPython, MCP, pytest."""
