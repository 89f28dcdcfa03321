// Package mcpserver is ctxd's Model Context Protocol server: it fronts a
// running daemon, through its client, for agents that speak MCP (`ctxd
// mcp` serves it over stdio; the daemon serves it over streamable HTTP at
// /v1/mcp, with a client that calls its API in process).
//
// What it offers follows the sigil its client acts as (the token's, else
// the daemon's default), asked once when the server is made:
//
//   - the tool ask (scope "ask"): a query in a session — by default one
//     fixed for the MCP connection — answered through the daemon's
//     cache-stable prompt, with the summary's headline figures as
//     structured output;
//   - the tool search_codex (scope "search_codex"): the codex excerpts that
//     best match a query (a codex retrieved from: RAG mode);
//   - the tool status, always: the daemon's GET /v1/status;
//   - the codex's files as resources ctxd-codex:///<path>, text/plain and
//     redacted as prompts see them (scope "search_codex"), listed from the
//     daemon on every resources/list, so they follow codex reloads.
//
// Daemon errors become tool error results (or JSON-RPC errors for
// resources) that name the problem; nothing a client sends crashes the
// server.
//
// It is not a daemon: it holds no state beyond each connection's default
// session id, and it is not an MCP client. It offers no karma_verify tool:
// karma (verified traces) does not exist in the daemon yet.
package mcpserver
