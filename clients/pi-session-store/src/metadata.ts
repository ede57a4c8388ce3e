import type { SessionCreateOptions } from "@earendil-works/pi-agent-core";

/**
 * NatsSessionMetadata describes a conversation of the store. Its fields are those of Pi's
 * JsonlSessionMetadata (the header line's id, timestamp, cwd, parentSession and
 * metadata), plus the path that Pi's JSONL layout gives the conversation relative to a
 * sessions root: where `pisync recover` writes it back, and what a fork records as its
 * parent when the caller names none.
 */
export interface NatsSessionMetadata {
  id: string;
  createdAt: string;
  cwd: string;
  path: string;
  parentSessionPath?: string;
  metadata?: Record<string, unknown>;
}

/** NatsSessionCreateOptions are Pi's JsonlSessionCreateOptions. */
export interface NatsSessionCreateOptions extends SessionCreateOptions {
  cwd: string;
  parentSessionPath?: string;
  metadata?: Record<string, unknown>;
}

/** NatsSessionListOptions narrow `list` to one working directory, as Pi's JSONL repo does. */
export interface NatsSessionListOptions {
  cwd?: string;
}
