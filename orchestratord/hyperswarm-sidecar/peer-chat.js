#!/usr/bin/env node
// Chat with a model shared over Hyperswarm:
//   node peer-chat.js <server-id> "your prompt" [--bootstrap host:port,...] [--host 127.0.0.1]
'use strict'

const { connect, chat } = require('./peer')

async function main () {
  const [serverId, prompt, ...rest] = process.argv.slice(2)
  if (!serverId || !prompt) {
    console.error('usage: node peer-chat.js <server-id> "prompt" [--bootstrap host:port,...] [--host addr]')
    process.exit(2)
  }
  const opts = {}
  for (let i = 0; i < rest.length; i += 2) {
    if (rest[i] === '--bootstrap') opts.bootstrap = rest[i + 1].split(',')
    else if (rest[i] === '--host') opts.host = rest[i + 1]
  }
  const conn = await connect(serverId, opts)
  const info = await conn.next((m) => m.type === 'server_info' || m.type === 'error')
  if (info.type === 'error') throw new Error(`${info.payload.code}: ${info.payload.message}`)
  console.error(`connected to ${info.payload.host_name} (${info.payload.model}, ${info.payload.status})`)
  const end = await chat(conn, 'cli-1', prompt, (t) => process.stdout.write(t))
  process.stdout.write('\n')
  console.error(`[${end.finish_reason}]`)
  await conn.close()
}

main().catch((e) => { console.error(e.message); process.exit(1) })
