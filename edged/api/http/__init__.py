"""The socket API's HTTP/1.1 transport: listeners, the per-connection protocol, messages,
routes, body budgets and the browser guards. Knows nothing of KServe."""
