"""What the server and the gateway share (moved from server/): request bodies, errors, the SSE
writer, what a connection says, the clients file, the body limit."""
