"""llm-infra-mcp: MCP servers that let an agent plan and run LLM-infrastructure experiments."""

__version__ = "0.1.0"
