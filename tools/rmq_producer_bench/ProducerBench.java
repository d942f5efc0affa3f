/*
 * The stock RocketMQ 4.9.8 producer (DefaultMQProducer) as a load generator, for
 * `dledger bench rocketmq-java` (docs/benchmarks.md, "Round 2"): the same program
 * against a real RocketMQ DLedger-mode group and against a dledger broker group.
 *
 *   rmq-java ProducerBench.java --namesrv 127.0.0.1:9876 --topic BenchTopic --mode single|batch
 *       [--threads 16] [--batch 32] [--size 1024] [--queues 8] [--warmup 3] [--duration 10]
 *
 * Each thread sends synchronously (send(msg, queue) or send(list, queue)), one request at a
 * time, over the topic's queues round-robin. Sends that start within the measured window
 * (after the warm-up) are counted and timed; one JSON line is printed on stdout:
 *   {"mode":..,"threads":..,"batch":..,"msgs_per_s":..,"sends":..,"messages":..,"seconds":..,
 *    "p50_ms":..,"p99_ms":..,"errors":..,"first_error":..}
 * and the lines "window-start" and "window-end" when the measured window opens and closes.
 * Exit status 2 on bad arguments or when the topic's queues never show up (one line on stderr).
 */
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

public class ProducerBench {
    static Map<String, String> parse(String[] args) {
        Map<String, String> o = new HashMap<>();
        o.put("threads", "16"); o.put("batch", "32"); o.put("size", "1024"); o.put("queues", "8");
        o.put("warmup", "3"); o.put("duration", "10"); o.put("topic", "BenchTopic"); o.put("mode", "single");
        o.put("timeout", "10000");
        for (int i = 0; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) fail("bad argument " + args[i]);
            o.put(args[i].substring(2), args[i + 1]);
        }
        if (!o.containsKey("namesrv")) fail("--namesrv HOST:PORT is required");
        if (!o.get("mode").equals("single") && !o.get("mode").equals("batch")) fail("--mode is single or batch");
        return o;
    }

    static void fail(String why) {
        System.err.println("ProducerBench: error: " + why);
        System.exit(2);
    }

    /** Per-thread latencies in microseconds, grown as needed. */
    static final class Times {
        long[] v = new long[1 << 14];
        int n;
        void add(long us) {
            if (n == v.length) v = Arrays.copyOf(v, n * 2);
            v[n++] = us;
        }
    }

    static void sleepUntil(long nanoTime) throws InterruptedException {
        long left;
        while ((left = nanoTime - System.nanoTime()) > 0) Thread.sleep(Math.max(1, left / 1_000_000));
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> o = parse(args);
        final int threads = Integer.parseInt(o.get("threads")), size = Integer.parseInt(o.get("size"));
        final int queues = Integer.parseInt(o.get("queues"));
        final boolean batched = o.get("mode").equals("batch");
        final int batch = batched ? Integer.parseInt(o.get("batch")) : 1;
        final double warmup = Double.parseDouble(o.get("warmup")), duration = Double.parseDouble(o.get("duration"));
        final String topic = o.get("topic");
        final long timeout = Long.parseLong(o.get("timeout"));

        DefaultMQProducer producer = new DefaultMQProducer("bench_java_pg");
        producer.setNamesrvAddr(o.get("namesrv"));
        producer.setDefaultTopicQueueNums(queues);
        producer.setSendMsgTimeout((int) timeout);
        producer.setInstanceName("bench-" + System.nanoTime());
        producer.start();
        try {
            // the topic's queues, from the name server (the caller created the topic)
            List<MessageQueue> mqs = null;
            long until = System.currentTimeMillis() + 60_000;
            while (System.currentTimeMillis() < until) {
                try {
                    mqs = producer.fetchPublishMessageQueues(topic);
                    if (mqs.size() >= queues) break;
                } catch (Exception e) {
                    mqs = null;
                }
                Thread.sleep(200);
            }
            if (mqs == null || mqs.size() < queues) fail("the topic " + topic + " has no " + queues + " queues on the name server");
            final List<MessageQueue> targets = new ArrayList<>(mqs.subList(0, queues));
            final byte[] body = new byte[size];
            Arrays.fill(body, (byte) 'x');
            final long start = System.nanoTime();
            final long measureFrom = start + (long) (warmup * 1e9), measureTo = measureFrom + (long) (duration * 1e9);
            final AtomicLong errors = new AtomicLong();
            final AtomicReference<String> firstError = new AtomicReference<>();
            final Times[] times = new Times[threads];
            Thread[] workers = new Thread[threads];
            for (int t = 0; t < threads; t++) {
                final int me = t;
                times[t] = new Times();
                workers[t] = new Thread(() -> {
                    int q = me % queues;
                    while (true) {
                        long t0 = System.nanoTime();
                        if (t0 >= measureTo) break;
                        MessageQueue mq = targets.get(q);
                        q = (q + 1) % queues;
                        boolean ok;
                        try {
                            SendResult r;
                            if (batched) {
                                List<Message> msgs = new ArrayList<>(batch);
                                for (int i = 0; i < batch; i++) msgs.add(new Message(topic, "TagA", body));
                                r = producer.send(msgs, mq, timeout);
                            } else {
                                r = producer.send(new Message(topic, "TagA", body), mq, timeout);
                            }
                            ok = r.getSendStatus() == SendStatus.SEND_OK;
                            if (!ok) firstError.compareAndSet(null, String.valueOf(r.getSendStatus()));
                        } catch (Exception e) {
                            ok = false;
                            firstError.compareAndSet(null, e.getClass().getSimpleName() + ": " + e.getMessage());
                        }
                        long t1 = System.nanoTime();
                        if (t0 >= measureFrom) {
                            if (ok) times[me].add((t1 - t0) / 1000);
                            else errors.incrementAndGet();
                        }
                    }
                }, "bench-" + t);
                workers[t].start();
            }
            // markers for the caller, which samples the servers' CPU over the measured window
            sleepUntil(measureFrom);
            System.out.println("window-start");
            System.out.flush();
            sleepUntil(measureTo);
            System.out.println("window-end");
            System.out.flush();
            for (Thread w : workers) w.join();
            int total = 0;
            for (Times t : times) total += t.n;
            long[] all = new long[total];
            int at = 0;
            for (Times t : times) {
                System.arraycopy(t.v, 0, all, at, t.n);
                at += t.n;
            }
            Arrays.sort(all);
            double p50 = total > 0 ? all[(int) Math.min(total - 1, Math.floor(total * 0.50))] / 1000.0 : 0;
            double p99 = total > 0 ? all[(int) Math.min(total - 1, Math.floor(total * 0.99))] / 1000.0 : 0;
            String err = firstError.get();
            System.out.println(String.format(java.util.Locale.ROOT,
                "{\"mode\":\"%s\",\"threads\":%d,\"batch\":%d,\"size\":%d,\"queues\":%d,\"msgs_per_s\":%d,"
                    + "\"sends\":%d,\"messages\":%d,\"seconds\":%.2f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"errors\":%d,"
                    + "\"first_error\":%s}",
                o.get("mode"), threads, batch, size, queues, Math.round(total * (double) batch / duration), total,
                (long) total * batch, duration, p50, p99, errors.get(),
                err == null ? "null" : "\"" + err.replace("\\", "\\\\").replace("\"", "'").replace("\n", " ") + "\""));
        } finally {
            producer.shutdown();
        }
    }
}
