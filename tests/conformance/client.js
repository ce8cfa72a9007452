// A Waltz client in Node.js, written from protos/ and docs/protocol.md alone (nothing generated or copied from
// the Python code): the conformance run of tests/conformance/test_node_client.py.
//
//   node client.js HOST:PORT
//
// Given one server address it discovers the cluster, takes a client id, mounts partitions 0 and 1, appends 1,000
// transactions (some under locks, one with a stale lock that must fail with its LockFailure), reads the feed back
// dense and complete, fetches data by id with the CRC checked and flushes. It prints {"phase": "steady", ...} and
// then waits for one of its partitions to move: it must hear it on its stream (an unasked NOT_READY), find the new
// owner, remount there, see a re-sent append answered ALREADY_COMMITTED and go on appending. Last line:
// {"phase": "done", ...}; any failure: {"error": ...} and exit status 1.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const PROTOS = path.resolve(__dirname, '..', '..', 'protos');
const definition = loader.loadSync(['waltz/v1/server.proto'], {
  keepCase: true, longs: String, enums: String, defaults: true, oneofs: true, includeDirs: [PROTOS],
});
const waltz = grpc.loadPackageDefinition(definition).waltz.v1;

const CALL_MS = 10000;
const WAIT_MS = 90000;
const PARTITIONS = [0, 1];
const PER_PARTITION = 500;
const AFTER_MOVE = 100;
const BATCH = 100;

// ---- the spec's functions --------------------------------------------------------------------------------

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

function crc32(bytes) { // IEEE 802.3, as a signed 32-bit integer (common.proto)
  let c = 0xFFFFFFFF;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >>> 8);
  return (c ^ 0xFFFFFFFF) | 0;
}

function lockHash(name, id) { // server.proto, above AppendRequest; id is a BigInt (signed 64-bit)
  const low = Number(BigInt.asUintN(32, id));
  const high = Number(BigInt.asUintN(32, id >> 32n));
  return (crc32(Buffer.from(name, 'utf8')) ^ low ^ high) | 0;
}

function lockKeyId(key) { // docs/protocol.md, "Lock keys": a string (UTF-8) or Buffer key's signed 64-bit lock id
  const bytes = Buffer.isBuffer(key) ? key : Buffer.from(key, 'utf8');
  return crypto.createHash('sha256').update(bytes).digest().readBigInt64BE(0);
}

function keyVectors() {
  const text = fs.readFileSync(path.resolve(__dirname, '..', '..', 'docs', 'protocol.md'), 'utf8');
  const pattern = /^\s+- lock_key_id\("([^"]*)"\) = (-?\d+)$/gm;
  return [...text.matchAll(pattern)].map((m) => ({key: m[1], spec: m[2], node: lockKeyId(m[1]).toString()}));
}

function specVectors() {
  const text = fs.readFileSync(path.join(PROTOS, 'waltz', 'v1', 'server.proto'), 'utf8');
  const pattern = /^\/\/\s+lock_hash\("([^"]*)", (-?\d+)\) = (-?\d+)$/gm;
  return [...text.matchAll(pattern)].map((m) => ({name: m[1], id: m[2], spec: Number(m[3])}));
}

// ---- plumbing --------------------------------------------------------------------------------------------

const stubs = new Map();
function stub(address) {
  if (!stubs.has(address)) stubs.set(address, new waltz.WaltzServer(address, grpc.credentials.createInsecure()));
  return stubs.get(address);
}

function unary(address, method, request) {
  return new Promise((resolve, reject) => {
    stub(address)[method](request, {deadline: Date.now() + CALL_MS}, (err, reply) => (err ? reject(err) : resolve(reply)));
  });
}

class Failure extends Error {}
function check(condition, message) { if (!condition) throw new Failure(message); }

const waiters = new Set();
function changed() { for (const w of [...waiters]) w(); }
function waitFor(predicate, what, ms = WAIT_MS) {
  return new Promise((resolve, reject) => {
    const test = () => {
      let value;
      try { value = predicate(); } catch (e) { waiters.delete(test); clearTimeout(timer); reject(e); return; }
      if (value) { waiters.delete(test); clearTimeout(timer); resolve(value); }
    };
    const timer = setTimeout(() => { waiters.delete(test); reject(new Failure(`timed out waiting for ${what}`)); }, ms);
    waiters.add(test);
    test();
  });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- the client ------------------------------------------------------------------------------------------

let clientId = 0;
let streamCount = 0; // MountRequest.seq_num: one more for every stream this process opens
const streams = new Map(); // address -> Stream
const parts = new Map(); // partition id -> its state

class Stream {
  constructor(address) {
    this.address = address;
    this.number = ++streamCount;
    this.call = stub(address).Stream();
    this.ended = null;
    this.call.on('data', (message) => { receive(this, message); changed(); });
    this.call.on('error', (err) => { this.ended = String(err); changed(); });
    this.call.on('end', () => { this.ended = this.ended || 'ended'; changed(); });
  }
  send(message) { this.call.write(message); }
}

function streamTo(address) {
  let s = streams.get(address);
  if (!s || s.ended) { s = new Stream(address); streams.set(address, s); }
  return s;
}

function partitionState(pid) {
  return {
    pid, generation: 0, stream: null, seq: 0, hwm: -1, mount: null, answers: new Map(), mounted: false,
    lost: null, fed: [], mine: new Map(), sent: new Map(), lockFailures: new Map(), rejected: new Map(),
    flushes: [], problems: [], inline: 0,
  };
}

function reqId(p) { // the next ReqId of the partition's counter (ReqId.seq_num)
  p.seq += 1;
  return {client_id: clientId, generation: p.generation, partition_id: p.pid, seq_num: p.seq};
}

function receive(stream, message) {
  const kind = message.message;
  const body = message[kind];
  if (kind === 'feed') {
    for (const t of body.transactions) {
      const p = parts.get(t.req_id.partition_id);
      if (!p || p.stream !== stream) continue;
      const id = Number(t.transaction_id);
      if (id <= p.hwm) continue; // a replay after a remount
      if (id !== p.hwm + 1) { p.problems.push(`gap: got ${id} after ${p.hwm}`); continue; }
      p.hwm = id;
      p.fed.push(id);
      if (t.has_data) { // inline data (MountRequest.inline_data_max_bytes): checked as fetched data is
        p.inline += 1;
        if (crc32(t.data) !== t.checksum) p.problems.push(`inline data of ${id} does not match its checksum`);
        const sent = t.req_id.client_id === clientId && p.sent.get(t.req_id.seq_num);
        if (sent && !Buffer.from(t.data).equals(Buffer.from(sent.data))) p.problems.push(`inline data of ${id} differs`);
      }
      if (t.req_id.client_id === clientId) {
        if (p.mine.has(t.req_id.seq_num)) p.problems.push(`seq ${t.req_id.seq_num} committed twice`);
        p.mine.set(t.req_id.seq_num, id);
      }
    }
    return;
  }
  const p = parts.get(body.req_id.partition_id);
  if (!p) return;
  const seq = body.req_id.seq_num;
  if (kind === 'mount') {
    if (p.mounted && body.state === 'NOT_READY' && p.mount && seq === p.mount.seq_num && stream === p.stream) {
      p.mounted = false; // the server ended our mount: the partition moved or closed
      p.lost = {state: body.state, hwm: Number(body.high_water_mark)};
    }
    p.answers.set(seq, body);
    if (p.mount && seq === p.mount.seq_num && body.state === 'READY') p.mounted = true;
  } else if (kind === 'lock_failure') {
    p.lockFailures.set(seq, Number(body.transaction_id));
  } else if (kind === 'append_rejected') {
    p.rejected.set(seq, {reason: body.reason, transaction_id: Number(body.transaction_id), message: body.message});
  } else if (kind === 'flush') {
    p.flushes.push({seq, transaction_id: Number(body.transaction_id)});
  }
}

async function mount(p, address, generation) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    p.generation = generation;
    p.stream = streamTo(address);
    p.mounted = false;
    p.lost = null;
    p.mount = reqId(p);
    const sent = p.mount;
    // the first partition asks for inline data (docs/protocol.md, section 6), the other does not
    const inline = p.pid === PARTITIONS[0] ? 4096 : 0;
    p.stream.send({mount: {req_id: sent, client_high_water_mark: p.hwm, seq_num: p.stream.number,
      inline_data_max_bytes: inline}});
    const answer = await waitFor(() => p.answers.get(sent.seq_num) || (p.stream.ended && {state: 'ENDED'}),
      `the mount of partition ${p.pid}`);
    if (answer.state === 'READY') return;
    check(answer.state === 'NOT_READY' || answer.state === 'ENDED', `mount of ${p.pid}: ${JSON.stringify(answer)}`);
    check(Date.now() < deadline, `partition ${p.pid} never got ready at ${address}`);
    await sleep(300); // still opening there: look again
    const info = await unary(address, 'GetClusterInfo', {});
    address = info.partitions[p.pid].address || address;
    generation = info.partitions[p.pid].generation;
  }
}

function append(p, data, locks = {}) {
  const req = reqId(p);
  const write = (locks.write || []).map(([n, i]) => lockHash(n, BigInt(i)));
  const read = (locks.read || []).map(([n, i]) => lockHash(n, BigInt(i)));
  const request = {
    req_id: req, client_high_water_mark: locks.hwm !== undefined ? locks.hwm : p.hwm,
    write_lock_request_length: write.length, write_locks: write,
    read_lock_request_length: read.length, read_locks: read,
    append_lock_request_length: 0, append_locks: [],
    header: 7, data_length: data.length, data, checksum: crc32(data),
  };
  p.sent.set(req.seq_num, {request, data});
  return request;
}

function sendBatch(p, requests) { p.stream.send({appends: {requests}}); }

async function appendMany(p, count, label) {
  const rejectedBefore = p.rejected.size;
  let first = null;
  let last = null;
  for (let start = 0; start < count; start += BATCH) {
    const batch = [];
    for (let i = start; i < Math.min(count, start + BATCH); i++) {
      const data = Buffer.from(`${label}-${p.pid}-${i}`);
      const locks = i % 10 === 0 ? {write: [[`${label}-account`, i]], read: [['never-written', i]]} : {};
      batch.push(append(p, data, locks));
    }
    sendBatch(p, batch);
    first = first === null ? batch[0].req_id.seq_num : first;
    last = batch[batch.length - 1].req_id.seq_num;
  }
  await waitFor(() => p.mine.has(last) || p.problems.length || p.rejected.size > rejectedBefore,
    `${count} commits on ${p.pid}`);
  check(!p.problems.length, p.problems.join('; '));
  for (let seq = first; seq <= last; seq++) {
    check(p.mine.has(seq), `partition ${p.pid}: append ${seq} did not commit (${JSON.stringify(p.rejected.get(seq))})`);
  }
  return last;
}

async function fetchAndCheck(p, seqs) {
  for (const seq of seqs) {
    const id = p.mine.get(seq);
    const reply = await unary(p.stream.address, 'GetTransactionData', {
      req_id: {client_id: clientId, generation: p.generation, partition_id: p.pid, seq_num: 0}, transaction_id: id,
    });
    check(reply.success, `data of ${p.pid}/${id}: ${reply.error_message}`);
    check(crc32(reply.data) === reply.checksum, `CRC of ${p.pid}/${id} does not match its checksum`);
    check(reply.data.equals(p.sent.get(seq).data), `data of ${p.pid}/${id} is not what was appended`);
  }
  return seqs.length;
}

async function flush(p, lastSeq) {
  const req = p.sent.get(lastSeq).request.req_id;
  const before = p.flushes.length;
  p.stream.send({flush: {req_id: req}});
  const answer = await waitFor(() => p.flushes.length > before && p.flushes[p.flushes.length - 1], 'a flush answer');
  check(answer.transaction_id >= p.mine.get(lastSeq), `flush answered ${answer.transaction_id}, before our commit`);
  return answer.transaction_id;
}

async function staleLock(p) {
  const winner = append(p, Buffer.from(`lock-winner-${p.pid}`), {write: [['stale', 1]]});
  sendBatch(p, [winner]);
  await waitFor(() => p.mine.has(winner.req_id.seq_num), 'the lock winner');
  const held = p.mine.get(winner.req_id.seq_num);
  const loser = append(p, Buffer.from(`lock-loser-${p.pid}`), {write: [['stale', 1]], hwm: held - 1});
  sendBatch(p, [loser]);
  const conflict = await waitFor(() => p.lockFailures.get(loser.req_id.seq_num), 'the stale lock\'s LockFailure');
  check(conflict >= held, `LockFailure names ${conflict}, below the holder ${held}`);
  return {held, conflict};
}

function readStatus(address, request) { // ReadTransactions to its end: 'OK' or the gRPC status code's name
  return new Promise((resolve) => {
    const call = stub(address).ReadTransactions(request, {deadline: Date.now() + CALL_MS});
    call.on('data', () => {});
    call.on('error', (err) => resolve(Object.keys(grpc.status).find((name) => grpc.status[name] === err.code)));
    call.on('end', () => resolve('OK'));
  });
}

async function edges(numPartitions, p, lastSeq) {
  // docs/protocol.md sections 4, 9 and 10: a Feed and a Flush for a partition id that does not exist, and reads
  // above the high-water mark. The stream answers in order, so once a flush of p sent after them is answered, so
  // are they.
  const ghost = partitionState(numPartitions);
  ghost.stream = p.stream;
  parts.set(ghost.pid, ghost);
  const feed = reqId(ghost);
  p.stream.send({feed: {req_id: feed, client_high_water_mark: -1}});
  const flushed = reqId(ghost);
  p.stream.send({flush: {req_id: flushed}});
  await flush(p, lastSeq);
  parts.delete(ghost.pid);
  const answer = (req) => ghost.answers.get(req.seq_num) || {state: 'none'};
  const hwm = Number((await unary(p.stream.address, 'GetHighWaterMark', {partition_id: p.pid})).high_water_mark);
  const data = await unary(p.stream.address, 'GetTransactionData', {
    req_id: {client_id: clientId, generation: p.generation, partition_id: p.pid, seq_num: 0}, transaction_id: hwm + 1,
  });
  return {
    feed: answer(feed).state, flush: answer(flushed).state, flush_responses: ghost.flushes.length,
    message: answer(flushed).message,
    read_past: await readStatus(p.stream.address, {partition_id: p.pid, from_transaction_id: hwm + 1,
      to_transaction_id: hwm + 5}),
    data_past: {success: data.success, error_message: data.error_message},
  };
}

async function denseAndComplete(p) {
  const reply = await unary(p.stream.address, 'GetHighWaterMark', {partition_id: p.pid});
  const hwm = Number(reply.high_water_mark);
  await waitFor(() => p.hwm >= hwm, `the feed of ${p.pid} up to ${hwm}`);
  p.fed.forEach((id, index) => check(id === index, `partition ${p.pid}: feed position ${index} holds ${id}`));
  return p.hwm;
}

async function main() {
  const seed = process.argv[2];
  check(seed, 'usage: node client.js HOST:PORT');
  const info = await unary(seed, 'GetClusterInfo', {});
  check(info.num_partitions >= 2, `the cluster has ${info.num_partitions} partitions, 2 are needed`);
  clientId = (await unary(seed, 'GetClientId', {})).client_id;
  check(clientId > 0, `client id ${clientId}`);
  const limits = info.limits;
  for (const pid of PARTITIONS) {
    const p = partitionState(pid);
    parts.set(pid, p);
    await mount(p, info.partitions[pid].address, info.partitions[pid].generation);
  }
  const last = {};
  const lastBefore = {};
  for (const p of parts.values()) last[p.pid] = await appendMany(p, PER_PARTITION, 'node');
  const locks = {};
  for (const p of parts.values()) locks[p.pid] = await staleLock(p);
  const dense = {};
  let fetched = 0;
  const flushed = {};
  for (const p of parts.values()) {
    dense[p.pid] = await denseAndComplete(p);
    fetched += await fetchAndCheck(p, [...p.mine.keys()].filter((seq, index) => index % 97 === 0));
    flushed[p.pid] = await flush(p, last[p.pid]);
    lastBefore[p.pid] = last[p.pid];
  }
  const vectors = specVectors().map((v) => ({...v, node: lockHash(v.name, BigInt(v.id))}));
  const first = parts.get(PARTITIONS[0]);
  const edge = await edges(info.num_partitions, first, last[first.pid]);
  emit({
    phase: 'steady', client_id: clientId, limits, appended: PER_PARTITION * parts.size, locks, dense, fetched,
    flushed, lock_hashes: vectors, lock_key_ids: keyVectors(), edges: edge,
    inline: Object.fromEntries([...parts.values()].map((p) => [p.pid, p.inline])),
  });

  // a partition moves: heard on the stream, found again, remounted there
  const moved = await waitFor(() => [...parts.values()].find((p) => p.lost), 'a partition to move');
  const oldGeneration = moved.generation;
  const heard = moved.lost;
  let owner = null;
  for (const deadline = Date.now() + WAIT_MS; !owner; await sleep(200)) {
    const now = (await unary(seed, 'GetClusterInfo', {})).partitions[moved.pid];
    if (now.address && now.generation > oldGeneration) owner = now;
    check(Date.now() < deadline, 'the moved partition never showed a new owner');
  }
  await mount(moved, owner.address, owner.generation);
  const resentSeq = lastBefore[moved.pid];
  const original = moved.sent.get(resentSeq).request; // as first sent: the old generation
  sendBatch(moved, [original]);
  const resent = await waitFor(() => moved.rejected.get(resentSeq), 'the answer to the re-sent append');
  check(resent.reason === 'ALREADY_COMMITTED', `re-send answered ${JSON.stringify(resent)}`);
  check(resent.transaction_id === moved.mine.get(resentSeq), 're-send names another transaction');
  for (const p of parts.values()) {
    if (p !== moved && !p.mounted) {
      const now = (await unary(seed, 'GetClusterInfo', {})).partitions[p.pid];
      await mount(p, now.address, now.generation);
    }
    last[p.pid] = await appendMany(p, AFTER_MOVE, 'after');
    dense[p.pid] = await denseAndComplete(p);
    flushed[p.pid] = await flush(p, last[p.pid]);
  }
  const mine = {};
  for (const p of parts.values()) mine[p.pid] = p.mine.size;
  emit({
    phase: 'done', moved: moved.pid, heard, new_owner: owner.address, old_generation: oldGeneration,
    new_generation: owner.generation, resent: resent.transaction_id, dense, flushed, committed: mine,
  });
}

function emit(line) { process.stdout.write(`${JSON.stringify(line)}\n`); }

main().then(() => {
  for (const s of streams.values()) s.call.end();
  process.exit(0);
}, (err) => {
  emit({error: err instanceof Failure ? err.message : String(err && err.stack ? err.stack : err)});
  process.exit(1);
});
