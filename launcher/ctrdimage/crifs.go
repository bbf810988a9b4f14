package ctrdimage

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

// CRI's ImageFsInfo, the one CRI call the shim makes, spoken on the wire
// without k8s.io/cri-api: that package's generated code, its descriptor
// and the descriptor's registration at init add about a megabyte to every
// shim's binary and a quarter of a megabyte to its heap, for one request
// with no fields and three fields of the answer (api.proto of
// k8s.io/cri-api v1):
//
//	message ImageFsInfoResponse  { repeated FilesystemUsage image_filesystems = 1; ... }
//	message FilesystemUsage      { int64 timestamp = 1; FilesystemIdentifier fs_id = 2; ... }
//	message FilesystemIdentifier { string mountpoint = 1; }
//
// The unit test checks this against the generated code.
const criImageFsInfoMethod = "/runtime.v1.ImageService/ImageFsInfo"

// Field numbers of the messages above.
const (
	fieldImageFilesystems protowire.Number = 1 // ImageFsInfoResponse
	fieldFsID             protowire.Number = 2 // FilesystemUsage
	fieldMountpoint       protowire.Number = 1 // FilesystemIdentifier
)

// imageFSMountpoints asks containerd's CRI for its image file systems and
// returns their mountpoints in its order ("" for one without).
func imageFSMountpoints(ctx context.Context, conn grpc.ClientConnInterface) ([]string, error) {
	var resp rawMessage
	// The request, ImageFsInfoRequest, has no fields: zero bytes.
	if err := conn.Invoke(ctx, criImageFsInfoMethod, &rawMessage{}, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
		return nil, err
	}
	return parseImageFsInfo(resp)
}

// parseImageFsInfo decodes an ImageFsInfoResponse into the mountpoints of
// its image_filesystems.
func parseImageFsInfo(b []byte) ([]string, error) {
	var mps []string
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if num != fieldImageFilesystems || typ != protowire.BytesType {
			return nil
		}
		mp := ""
		err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
			if num != fieldFsID || typ != protowire.BytesType {
				return nil
			}
			// The last occurrence of a non-repeated field wins, as in
			// proto.Unmarshal (a message field's are merged, and
			// FilesystemIdentifier has one field).
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
				if num == fieldMountpoint && typ == protowire.BytesType {
					mp = string(v)
				}
				return nil
			})
		})
		if err != nil {
			return err
		}
		mps = append(mps, mp)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("containerd's CRI ImageFsInfo answer is not a valid ImageFsInfoResponse: %w", err)
	}
	return mps, nil
}

// eachField calls f with each field of the protobuf message b; v is the
// payload of a length-delimited field, nil for the others.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// rawMessage is a protobuf message's wire bytes.
type rawMessage []byte

// rawCodec passes rawMessages through gRPC as they are. Its name is
// "proto", so the content type is application/grpc+proto as with the
// generated code.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(*rawMessage)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal a %T", v)
	}
	return *m, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*rawMessage)
	if !ok {
		return errors.New("rawCodec: can only unmarshal into a *rawMessage")
	}
	*m = append((*m)[:0], data...)
	return nil
}
