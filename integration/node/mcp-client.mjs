// Drives ctxd's MCP server with the official MCP TypeScript SDK's client
// and prints what it got as JSON. Usage: node mcp-client.mjs, with either
//   CTXD_MCP_CONFIG: a client's JSON config ({"mcpServers": {"ctxd":
//     {command, args, env}}}): the client launches the server as desktop
//     clients do and speaks to it over stdio; or
//   CTXD_MCP_URL (and CTXD_TOKEN): the daemon's streamable HTTP endpoint.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

let transport;
let stderr = "";
if (process.env.CTXD_MCP_URL) {
  transport = new StreamableHTTPClientTransport(new URL(process.env.CTXD_MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.CTXD_TOKEN}` } },
  });
} else {
  const server = JSON.parse(process.env.CTXD_MCP_CONFIG).mcpServers.ctxd;
  transport = new StdioClientTransport({
    command: server.command,
    args: server.args ?? [],
    // As desktop clients do: a small default environment plus the config's.
    env: { ...getDefaultEnvironment(), ...(server.env ?? {}) },
    stderr: "pipe",
  });
  transport.stderr?.on("data", (b) => (stderr += b));
}

const client = new Client({ name: "ctxd-integration", version: "0" });
const out = { errors: {} };
try {
  await client.connect(transport);
  out.server = client.getServerVersion();
  out.tools = (await client.listTools()).tools.map((t) => t.name).sort();
  out.asks = [];
  for (const query of ["What does Handler3 return?", "Which handler serves kind 7?"]) {
    const r = await client.callTool({ name: "ask", arguments: { query, session: "mcp-npm" } });
    out.asks.push({ isError: r.isError ?? false, text: r.content.map((c) => c.text).join(""), summary: r.structuredContent });
  }
  const status = await client.callTool({ name: "status", arguments: {} });
  out.status = { isError: status.isError ?? false, json: JSON.parse(status.content[0].text) };
  out.resources = (await client.listResources()).resources.map((r) => r.uri).sort();
  const readme = await client.readResource({ uri: "ctxd-codex:///README.md" });
  out.readme = readme.contents[0].text;

  // Bad input: each is an MCP error result or a JSON-RPC error, and the
  // server goes on serving.
  const toolError = async (name, args) => {
    try {
      const r = await client.callTool({ name, arguments: args });
      return { isError: r.isError ?? false, text: r.content.map((c) => c.text).join("") };
    } catch (e) {
      return { thrown: true, code: e.code, text: e.message };
    }
  };
  out.errors.search_cag = await toolError("search_codex", { query: "Handler3" });
  out.errors.missing_query = await toolError("ask", {});
  out.errors.bad_session = await toolError("ask", { query: "q", session: "../etc" });
  out.errors.unknown_tool = await toolError("rm_rf", {});
  try {
    await client.readResource({ uri: "ctxd-codex:///no/such/file.go" });
    out.errors.unknown_resource = { thrown: false };
  } catch (e) {
    out.errors.unknown_resource = { thrown: true, code: e.code, text: e.message };
  }
  out.after_errors = (await client.callTool({ name: "status", arguments: {} })).isError ?? false;
} catch (e) {
  out.fatal = `${e.name}: ${e.message}\n${stderr}`;
} finally {
  await client.close();
}
console.log(JSON.stringify(out));
