"""An MCP server that sends what a careless or hostile server may send, written as raw JSON-RPC lines so that nothing
on its side checks it: `python hostile_server.py MODE [N]`.

MODE is one of: `deep N` (a tool whose input schema nests N levels), `invalid` (tools with broken schemas among good
ones), `many N` (N tools), `flood N` (a tool `flood` that sends N tools-changed notices before it answers, and `lists`, the number of
tools/list requests answered), `collide`
(tool names that become the same once made safe for function calling). Every call answers with the tool's name and
its arguments, so a test can tell which tool a call reached."""
import json, sys

MODE = sys.argv[1] if len(sys.argv) > 1 else 'many'
N = int(sys.argv[2]) if len(sys.argv) > 2 else 10
LONG = 'x' * 64
LISTED = []  # the tools/list requests answered so far


DEEP = '"@deep@"'  # stands for the deep schema until the message is written: json.dumps would recurse on it


def deep(n:int) -> str:
    "A schema nesting `n` objects, as JSON text."
    return '{"type": "object", "properties": {"x": ' * n + '{"type": "string"}' + '}}' * n


def tool(name:str, schema=None) -> dict:
    return {'name': name, 'description': f'The tool {name}.',
            'inputSchema': {'type': 'object', 'properties': {'text': {'type': 'string'}}} if schema is None else schema}


def tools() -> list[dict]:
    if MODE == 'deep': return [tool('deep', {'type': 'object', 'properties': {'a': DEEP[1:-1]}}), tool('ok')]
    if MODE == 'invalid':
        return [tool('first'), tool('not_a_schema', 'a string, not a schema'), {'description': 'a tool with no name'},
                tool('bad_props', {'type': 'object', 'properties': 5}), tool('last')]
    if MODE == 'many': return [tool(f't{i}') for i in range(N)]
    if MODE == 'flood': return [tool('flood', {'type': 'object', 'properties': {}}), tool('lists', {'type': 'object'})]
    if MODE == 'collide': return [tool('a b'), tool('a_b'), tool(LONG + '_one'), tool(LONG + '_two'), tool('a.b')]
    raise SystemExit(f'hostile_server: unknown mode {MODE!r}')


def send(msg:dict):
    sys.stdout.write(json.dumps(msg).replace(DEEP, deep(N)) + '\n')


def answer(req:dict):
    method, params, rid = req.get('method'), req.get('params') or {}, req.get('id')
    if method == 'initialize':
        result = {'protocolVersion': '2025-06-18', 'capabilities': {'tools': {'listChanged': True}},
                  'serverInfo': {'name': 'hostile', 'version': '1'}}
    elif method == 'tools/list':
        LISTED.append(rid)
        result = {'tools': tools()}
    elif method == 'tools/call':
        if params.get('name') == 'flood':
            for _ in range(N): send({'jsonrpc': '2.0', 'method': 'notifications/tools/list_changed'})
        if params.get('name') == 'lists': return send({'jsonrpc': '2.0', 'id': rid, 'result': {
            'content': [{'type': 'text', 'text': str(len(LISTED))}], 'isError': False}})
        text = f"{params.get('name')} {json.dumps(params.get('arguments') or {}, sort_keys=True)}"
        result = {'content': [{'type': 'text', 'text': text}], 'isError': False}
    elif method == 'ping': result = {}
    else: return send({'jsonrpc': '2.0', 'id': rid, 'error': {'code': -32601, 'message': f'no method {method}'}})
    send({'jsonrpc': '2.0', 'id': rid, 'result': result})


if __name__ == '__main__':
    for line in sys.stdin:
        req = json.loads(line)
        if 'id' in req and 'method' in req: answer(req)
        sys.stdout.flush()
