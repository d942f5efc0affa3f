'use strict';
// Drives the stock RocketMQ client ali-ons against a name server for dledger's process tests.
//
//   node failover.js NAMESRV TOPIC GROUP [--interval MS] [--max-seconds S]
//
// $ALIONS_ACCESS_KEY / $ALIONS_SECRET_KEY: the RocketMQ ACL account to sign requests with (ali-ons signs always;
// without them it signs as 'none', which a broker without ACL ignores).
// A producer sends "alions-<n>" every --interval ms (one at a time) and a push consumer of GROUP consumes
// TOPIC from its first offset.  One JSON object per line on stdout:
//   {"ev":"ready"}                                            both started
//   {"ev":"sent","body":"alions-7","msgId":"...","qid":1,"qoff":3,"t":1712345678901}
//   {"ev":"send_error","n":8,"error":"...","t":...}           that body is sent again until acknowledged
//   {"ev":"recv","body":"alions-7","qid":1,"qoff":3,"msgId":"...","t":...}
//   {"ev":"stopped","sent":N}                                 after "stop" on stdin: no more sends
//   {"ev":"exit"}                                             after "exit" on stdin (or --max-seconds)
// The test reads these lines; the script never decides pass/fail.  --max-seconds bounds its life.
const { Producer, Consumer, Message } = require('ali-ons');
const readline = require('readline');

const [namesrv, topic, group] = process.argv.slice(2, 5);
const opt = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const interval = opt('--interval', 20);
const maxSeconds = opt('--max-seconds', 120);
const out = obj => process.stdout.write(JSON.stringify(obj) + '\n');
const quiet = { info() {}, warn() {}, debug() {}, error(...a) { process.stderr.write(a.join(' ') + '\n'); } };
const common = {
  nameSrv: namesrv,
  // Only used to look up name servers from Aliyun's address service (onsAddr); nameSrv is given instead.
  httpclient: { async request() { throw new Error('no address service: nameSrv is set'); } },
  // RocketMQ ACL (rocketmq.aclEnable): the account ali-ons signs every request with.
  accessKeyId: process.env.ALIONS_ACCESS_KEY || 'none',
  accessKeySecret: process.env.ALIONS_SECRET_KEY || 'none',
  pollNameServerInteval: 1000,
  heartbeatBrokerInterval: 1000,
  persistConsumerOffsetInterval: 1000,
  rebalanceInterval: 1000,
  logger: quiet,
};

let producing = true;
let exiting = false;
let sent = 0;

async function produce(producer) {
  let n = 0;
  while (producing) {
    const body = `alions-${n}`;
    const msg = new Message(topic, 'TagA', body);
    try {
      const r = await producer.send(msg);
      out({ ev: 'sent', body, msgId: r.msgId, qid: r.messageQueue.queueId, qoff: r.queueOffset, t: Date.now() });
      n += 1;
      sent = n;
    } catch (err) {
      out({ ev: 'send_error', n, error: String(err && err.message || err).slice(0, 200), t: Date.now() });
    }
    await new Promise(r => setTimeout(r, interval));
  }
  out({ ev: 'stopped', sent });
}

async function main() {
  const producer = new Producer(Object.assign({ producerGroup: `${group}_pg`, instanceName: 'alions-producer',
    retryTimesWhenSendFailed: 0, sendMsgTimeout: 1000 }, common));
  const consumer = new Consumer(Object.assign({ consumerGroup: group, instanceName: 'alions-consumer',
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET', brokerSuspendMaxTimeMillis: 2000,
    consumerTimeoutMillisWhenSuspend: 5000, pullTimeDelayMillsWhenException: 200 }, common));
  producer.on('error', err => process.stderr.write(`producer: ${err.message}\n`));
  consumer.on('error', err => process.stderr.write(`consumer: ${err.message}\n`));
  consumer.subscribe(topic, '*', async msg => {
    out({ ev: 'recv', body: msg.body.toString(), qid: msg.queueId, qoff: Number(msg.queueOffset),
      msgId: msg.msgId, t: Date.now() });
  });
  await producer.ready();
  await consumer.ready();
  out({ ev: 'ready' });
  const finished = produce(producer);
  const finish = async () => {
    if (exiting) return;
    exiting = true;
    producing = false;
    await finished;
    await Promise.race([Promise.all([consumer.close(), producer.close()]), new Promise(r => setTimeout(r, 3000))]);
    out({ ev: 'exit' });
    process.exit(0);
  };
  readline.createInterface({ input: process.stdin }).on('line', line => {
    if (line.trim() === 'stop') producing = false;
    if (line.trim() === 'exit') finish();
  }).on('close', finish);
  setTimeout(finish, maxSeconds * 1000).unref();
}

main().catch(err => {
  process.stderr.write(`alions driver failed: ${err.stack || err}\n`);
  process.exit(1);
});
