// @pisync/pi-session-store: Pi's session storage port (SessionRepo / SessionStorage of
// @earendil-works/pi-agent-core) on pisync's NATS session store, `pisync serve`.
export { NatsSessionRepo, headerLine, type NatsSessionRepoOptions } from "./repo.js";
export { NatsSessionStorage, type Appender } from "./storage.js";
export { StoreClient, type ClientOptions, type Opened } from "./client.js";
export { StoreError, StoreConflictError, type StoreCode } from "./errors.js";
export type { NatsSessionMetadata, NatsSessionCreateOptions, NatsSessionListOptions } from "./metadata.js";
export { encodeToken, subject } from "./protocol.js";
