"""A small MCP server for the client's fault tests: slow calls, a crash mid-call, error results, non-text content,
and a tool added while it runs (announced as changed tools). Serves stdio: `python fault_server.py [--fail]`."""
import asyncio, base64, os, sys
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import EmbeddedResource, TextResourceContents

server = MCPServer('faults')
PNG = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')

@server.tool()
def echo(text: str) -> str:
    "Say `text` back."
    return text

@server.tool()
def pid() -> int:
    "The server's process id."
    return os.getpid()

@server.tool()
async def slow(seconds: float) -> str:
    "Wait `seconds`, then answer."
    await asyncio.sleep(seconds)
    return f'waited {seconds:g}s'

@server.tool()
async def crash(after: float = 0.2) -> str:
    "Exit the server process in the middle of this call."
    await asyncio.sleep(after)
    print('fault_server: crashing on purpose', file=sys.stderr, flush=True)
    os._exit(3)

@server.tool()
def fail(message: str = 'no such account') -> str:
    "Always fail with `message`."
    raise ToolError(message)

@server.tool()
def picture() -> Image:
    "A one-pixel PNG."
    return Image(data=PNG, format='png')

@server.tool()
def document() -> EmbeddedResource:
    "A text resource embedded in the result."
    memo = TextResourceContents(uri='memo://rules', text='Flag refunds over 500.', mime_type='text/plain')
    return EmbeddedResource(type='resource', resource=memo)

def late(text: str) -> str:
    "A tool that exists only after `grow` ran: says `text` back, shouted."
    return text.upper()

@server.tool()
async def grow(ctx: Context) -> str:
    "Add the tool `late` to this server and announce that its tools changed."
    server.add_tool(late)
    try: await ctx.session.send_tool_list_changed()  # clients of the handshake era
    except Exception as e: print(f'fault_server: no session notice: {e!r}', file=sys.stderr)
    try: await ctx.notify_tools_changed()  # clients listening on subscriptions/listen (2026 era)
    except Exception as e: print(f'fault_server: no subscription notice: {e!r}', file=sys.stderr)
    return 'added late'

if __name__ == '__main__':
    if '--fail' in sys.argv: sys.exit('fault_server: refusing to start (--fail given)')
    server.run()
