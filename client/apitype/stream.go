package apitype

// Websocket subprotocols (Kubernetes remotecommand framing).
const (
	StreamProtocolV5 = "v5.channel.k8s.io"
	StreamProtocolV4 = "v4.channel.k8s.io"
)

// Channel bytes: the first byte of every binary websocket message.
const (
	ChannelStdin  byte = 0
	ChannelStdout byte = 1
	ChannelStderr byte = 2
	ChannelStatus byte = 3
	ChannelResize byte = 4
	// ChannelClose carries one more byte: the channel being closed ("255 0" ends stdin). v5 only.
	ChannelClose byte = 255
)

// Resize is the payload of a ChannelResize message.
type Resize struct {
	Width  uint16 `json:"Width"`
	Height uint16 `json:"Height"`
}

// Status is the payload of the ChannelStatus message sent once when the process ends,
// shaped like Kubernetes' metav1.Status with sidecar's own fields added.
type Status struct {
	Status  string         `json:"status"` // "Success" or "Failure"
	Reason  string         `json:"reason,omitempty"`
	Message string         `json:"message,omitempty"`
	Details *StatusDetails `json:"details,omitempty"`

	ExitCode  int    `json:"exit_code"`
	Signal    string `json:"signal,omitempty"`
	TimedOut  bool   `json:"timed_out"`
	OOMKilled bool   `json:"oom_killed"`
	Lost      bool   `json:"lost,omitempty"`
	// BytesLost counts output bytes this attachment never received (left the buffer
	// before a resume, or dropped for a slow reader).
	BytesLost int64 `json:"bytes_lost,omitempty"`
}

// StatusDetails carries the exit code as a cause, as Kubernetes does.
type StatusDetails struct {
	Causes []StatusCause `json:"causes,omitempty"`
}

// StatusCause is one cause; Kubernetes uses Type "ExitCode" with the code in Message.
type StatusCause struct {
	Type    string `json:"reason"`
	Message string `json:"message"`
}

// Kubernetes status values.
const (
	StatusSuccess         = "Success"
	StatusFailure         = "Failure"
	ReasonNonZeroExitCode = "NonZeroExitCode"
	CauseTypeExitCode     = "ExitCode"
)
