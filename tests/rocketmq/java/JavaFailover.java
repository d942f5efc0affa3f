import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;

import com.alibaba.fastjson.JSON;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The stock RocketMQ 4.9.8 Java client across a master kill (tests/rocketmq/test_rmq_java_process.py).
 *
 * JavaFailover NAMESRV TOPIC GROUP INTERVAL_MS: a DefaultMQProducer sending "java-N" every INTERVAL_MS, a
 * DefaultMQPushConsumer (GROUP_push) and a DefaultLitePullConsumer (GROUP_lite), all knowing only the name
 * server. One JSON line per event on stdout: ready, sent {body, t}, send_error {t, err}, recv {via, body},
 * stopped. stdin: "stop" ends the sends, "exit" shuts everything down.
 */
public class JavaFailover {
    static synchronized void emit(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        System.out.println(JSON.toJSONString(m));
        System.out.flush();
    }

    public static void main(String[] a) throws Exception {
        String namesrv = a[0], topic = a[1], group = a[2];
        long interval = Long.parseLong(a[3]);
        AtomicBoolean sending = new AtomicBoolean(true), running = new AtomicBoolean(true);

        DefaultMQProducer producer = new DefaultMQProducer(group + "_pg");
        producer.setNamesrvAddr(namesrv);
        producer.setPollNameServerInterval(1000);
        producer.setSendMsgTimeout(1000);
        producer.setRetryTimesWhenSendFailed(2);
        producer.start();

        DefaultMQPushConsumer push = new DefaultMQPushConsumer(group + "_push");
        push.setNamesrvAddr(namesrv);
        push.setPollNameServerInterval(1000);
        push.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        push.subscribe(topic, "*");
        push.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) emit("ev", "recv", "via", "push", "body", new String(m.getBody()));
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        push.start();

        DefaultLitePullConsumer lite = new DefaultLitePullConsumer(group + "_lite");
        lite.setNamesrvAddr(namesrv);
        lite.setPollNameServerInterval(1000);
        lite.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        lite.subscribe(topic, "*");
        lite.start();
        Thread poller = new Thread(() -> {
            while (running.get()) {
                try {
                    List<MessageExt> got = lite.poll(200);
                    for (MessageExt m : got) emit("ev", "recv", "via", "lite", "body", new String(m.getBody()));
                } catch (Exception e) {
                    emit("ev", "poll_error", "err", String.valueOf(e));
                }
            }
        });
        poller.start();

        Thread sender = new Thread(() -> {
            for (int i = 0; sending.get(); i++) {
                String body = "java-" + i;
                try {
                    SendResult r = producer.send(new Message(topic, "TagA", body.getBytes()));
                    if (r.getSendStatus() == SendStatus.SEND_OK)
                        emit("ev", "sent", "body", body, "t", System.currentTimeMillis(), "queue", r.getMessageQueue().getQueueId());
                    else
                        emit("ev", "send_error", "t", System.currentTimeMillis(), "err", String.valueOf(r.getSendStatus()));
                } catch (Exception e) {
                    emit("ev", "send_error", "t", System.currentTimeMillis(), "err", e.getClass().getSimpleName());
                }
                try { Thread.sleep(interval); } catch (InterruptedException e) { return; }
            }
            emit("ev", "stopped");
        });
        emit("ev", "ready");
        sender.start();

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            if (line.trim().equals("stop")) sending.set(false);
            if (line.trim().equals("exit")) break;
        }
        sending.set(false);
        sender.join(5000);
        running.set(false);
        poller.join(5000);
        producer.shutdown();
        push.shutdown();
        lite.shutdown();
        emit("ev", "exited");
        System.exit(0);
    }
}
