import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;

import com.alibaba.fastjson.JSON;
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
 * The stock RocketMQ 4.9.8 Java client under a live migration (tests/rocketmq/test_rmq_migrate_process.py).
 *
 * MigrationLoad NAMESRV TOPIC GROUP INTERVAL_MS: a DefaultMQProducer sending "mig-N" every INTERVAL_MS and a
 * DefaultMQPushConsumer (GROUP), both knowing only the name server. One JSON line per event on stdout:
 * ready, sent {body, t, q, off, broker}, send_error {t, err}, recv {body, q, off, reconsume}, stopped.
 * stdin: "stop" ends the sends, "exit" shuts everything down.
 */
public class MigrationLoad {
    static synchronized void emit(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        System.out.println(JSON.toJSONString(m));
        System.out.flush();
    }

    public static void main(String[] a) throws Exception {
        String namesrv = a[0], topic = a[1], group = a[2];
        long interval = Long.parseLong(a[3]);
        AtomicBoolean sending = new AtomicBoolean(true);

        DefaultMQProducer producer = new DefaultMQProducer(group + "_pg");
        producer.setNamesrvAddr(namesrv);
        producer.setPollNameServerInterval(1000);
        producer.setSendMsgTimeout(2000);
        producer.setRetryTimesWhenSendFailed(2);
        producer.start();

        DefaultMQPushConsumer push = new DefaultMQPushConsumer(group);
        push.setNamesrvAddr(namesrv);
        push.setPollNameServerInterval(1000);
        push.setPersistConsumerOffsetInterval(1000);
        push.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        push.subscribe(topic, "*");
        push.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs)
                emit("ev", "recv", "body", new String(m.getBody()), "q", m.getQueueId(), "off", m.getQueueOffset(),
                     "reconsume", m.getReconsumeTimes());
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        push.start();

        Thread sender = new Thread(() -> {
            for (int i = 0; sending.get(); i++) {
                String body = "mig-" + i;
                try {
                    SendResult r = producer.send(new Message(topic, "TagA", body.getBytes()));
                    if (r.getSendStatus() == SendStatus.SEND_OK)
                        emit("ev", "sent", "body", body, "t", System.currentTimeMillis(), "q",
                             r.getMessageQueue().getQueueId(), "off", r.getQueueOffset());
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
        producer.shutdown();
        push.shutdown();
        emit("ev", "exited");
        System.exit(0);
    }
}
