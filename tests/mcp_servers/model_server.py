"""A small MCP server whose tool takes a pydantic model with another model inside (the SDK lists it as a `$ref`
into `$defs`), and tells how many calls reached it. Serves stdio: `python model_server.py`."""
from pydantic import BaseModel, Field
from mcp.server.mcpserver import MCPServer

server = MCPServer('models')
calls = []

class Window(BaseModel):
    start: str = Field(description='first day, e.g. 2024-05-01')
    days: int = 7

class Query(BaseModel):
    "A query on one table."
    table: str
    window: Window
    tags: list[str] = []

@server.tool()
def run_query(query: Query, dry: bool = False) -> str:
    "Run a query on a table over a window of days."
    calls.append(query)
    return f"{query.table} from {query.window.start} for {query.window.days} days" + (' (dry)' if dry else '')

@server.tool()
def calls_seen() -> int:
    "How many calls of run_query reached the server."
    return len(calls)

if __name__ == '__main__':
    server.run()
