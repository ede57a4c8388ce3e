// The wire shapes of docs/store-protocol.md (pisync serve). Fields are only ever added
// there, so readers here ignore what they do not know.

import type { StoreCode } from "./errors.js";

/** Ops are the endpoints of the pisync-store service. */
export type Op = "create" | "list" | "open" | "append" | "fork" | "delete";

/** WireMeta is `meta` of create, list, open and fork replies. */
export interface WireMeta {
  id: string;
  createdAt: string;
  cwd: string;
  parentSessionPath?: string;
  metadata?: Record<string, unknown>;
  path: string;
  writer?: "store" | "daemon";
  generation?: number;
  entries?: number;
  head?: string | null;
  lastSeq?: number;
  /** metadata was left out: the reply could not carry it (a huge daemon-mirrored header). */
  metadataOmitted?: boolean;
}

/** WireError is `error` of a failed reply. */
export interface WireError {
  code: StoreCode;
  reason?: string;
  message?: string;
  head?: string | null;
  limit?: number;
}

/** Reply is the envelope every reply shares. */
export interface Reply {
  ok: boolean;
  error?: WireError;
}

export interface CreateReply extends Reply {
  seq: number;
  meta: WireMeta;
}

export interface ListReply extends Reply {
  sessions: WireMeta[];
  next?: number;
}

/** WireEntry is one entry of an open reply: inline, by reference, or a raw line. */
export interface WireEntry {
  ordinal: number;
  line?: string;
  raw?: boolean;
  size?: number;
  sha256?: string;
}

export interface OpenReply extends Reply {
  meta: WireMeta;
  head: string | null;
  generation: number;
  lastSeq: number;
  entries: WireEntry[];
  next?: { after: number };
}

export interface PartReply extends Reply {
  ordinal: number;
  offset: number;
  size: number;
  data: string;
  eof: boolean;
}

export interface AppendReply extends Reply {
  seq: number;
  ordinal: number;
  head: string | null;
  duplicate: boolean;
}

export interface UploadReply extends Reply {
  received: number;
}

/** PartSize is the most decoded bytes one upload part carries (less under a small max_payload). */
export const PartSize = 512 * 1024;

/** InlineLimit is the largest line (UTF-8 bytes) sent inline in an append (less under a small max_payload). */
export const InlineLimit = 512 * 1024;

/**
 * encodeToken encodes a tenant or owner name as a subject token: bytes in [A-Za-z0-9-]
 * stay, every other byte of its UTF-8 becomes `_` and two upper-case hex digits.
 */
export function encodeToken(name: string): string {
  let out = "";
  for (const byte of new TextEncoder().encode(name)) {
    const c = String.fromCharCode(byte);
    out += /[A-Za-z0-9-]/.test(c) ? c : "_" + byte.toString(16).toUpperCase().padStart(2, "0");
  }
  return out;
}

/** subject is the request subject of op for tenant and owner. */
export function subject(prefix: string, tenant: string, owner: string, op: Op): string {
  return `${prefix}.store.${encodeToken(tenant)}.${encodeToken(owner)}.${op}`;
}
